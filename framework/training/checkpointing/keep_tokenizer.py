"""``KeepTokenizer``: the run's tokenizer kept beside its checkpoints and recorded in
every one of them (framework/checkpoint/tokenizer_record.py says what the record holds
and how a checkpoint finds its tokenizer again).

At fit start (global rank 0) the data's tokenizer.json is copied to
``<checkpoint dir>/tokenizer.json``; every checkpoint then records it, with its sha256
and the data folder as an absolute path, under ``checkpoint["layerdrop"]``.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path
from typing import Any

import lightning.pytorch as pl

from framework.files.atomic_write import copy_file, replacing
from framework.checkpoint.base import CKPT_KEY, TOKENIZER_FILE
from framework.checkpoint.hf.tokens import hf_tokens_of
from framework.checkpoint.tokenizer_record import CONVENTION_KEYS, record_for, sha256_of
from framework.files.staging import is_url
from framework.tokenizer import check_model_tokenizer, model_stop_ids


class KeepTokenizer(pl.Callback):
    """Copies the data's tokenizer beside the checkpoints at fit start and records it
    (with its sha256, and the data folder as an absolute path) in every checkpoint.

    A run resumed in a folder whose tokenizer.json differs from the data's stops
    before its first step: its token ids would mean other strings. So does a run from
    ``model.init_from`` on data prepared with another tokenizer than the model's.
    """

    def __init__(self) -> None:
        self.record: dict[str, Any] | None = None
        self.data_dir: str | None = None
        self.source: str | None = None
        self.kept: Path | None = None

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        datamodule = trainer.datamodule
        manifest = getattr(datamodule, "manifest", None)  # read by the DataModule's setup, which runs first
        if stage != "fit" or not isinstance(manifest, dict) or not isinstance(manifest.get("tokenizer"), dict):
            return
        data_dir = str(datamodule.data_dir)
        self.data_dir = data_dir if is_url(data_dir) else os.path.abspath(data_dir)
        entry = manifest["tokenizer"]
        self.source = f"{self.data_dir}/{entry.get('file', TOKENIZER_FILE)}"
        self.record = record_for(sha256=self._sha256(), vocab_size=entry.get("vocab_size"),
                                 eos_token=entry.get("eos_token"), eos_id=entry.get("eos_id"),
                                 **{key: entry.get(key) for key in CONVENTION_KEYS})
        init_from = getattr(pl_module, "init_from", None)
        if init_from is not None:  # before the model is materialised: the DataModule's setup ran, configure_model not
            check_model_tokenizer(init_from, self.source, self.record)
            stops = model_stop_ids(init_from, self.record.get("eos_id"))
            if len(stops) > 1:  # Llama-3.x-Instruct's eos_token_id list outlives the run, into its exports
                self.record["eos_ids"] = stops
            carried = hf_tokens_of(init_from)
            if carried is not None:  # the folder's own special tokens, into the run's HF exports whole
                self.record["hf_tokens"] = carried

    def _sha256(self) -> str | None:
        if is_url(self.source):
            import fsspec

            with fsspec.open(self.source, "rb") as handle:
                return hashlib.sha256(handle.read()).hexdigest()
        return sha256_of(self.source) if os.path.isfile(self.source) else None

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        folder = getattr(trainer.checkpoint_callback, "dirpath", None)
        if self.record is None or self.record["sha256"] is None or not folder or is_url(str(folder)):
            return
        self.kept = Path(folder) / TOKENIZER_FILE
        if not trainer.is_global_zero:
            return
        if self.kept.is_file() and sha256_of(self.kept) != self.record["sha256"]:
            if any(Path(folder).glob("*.ckpt")):
                raise ValueError(f"{self.kept} (the tokenizer of the run's checkpoints) differs from the data's "
                                 f"{self.source}: resume with the data the run started with")
        elif self.kept.is_file():
            return
        self.kept.parent.mkdir(parents=True, exist_ok=True)
        if is_url(self.source):
            import fsspec

            with replacing(self.kept) as partial, fsspec.open(self.source, "rb") as source, \
                    open(partial, "wb") as target:
                shutil.copyfileobj(source, target)
        else:
            copy_file(self.source, self.kept)

    def on_save_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict) -> None:
        if self.record is not None:
            checkpoint.setdefault(CKPT_KEY, {}).update({"tokenizer": dict(self.record), "data_dir": self.data_dir})


__all__ = ["KeepTokenizer"]

"""The tokenizer a run trained with, kept beside its checkpoints and found again from
any working directory.

At fit start (global rank 0) ``KeepTokenizer`` copies the data's tokenizer.json to
``<checkpoint dir>/tokenizer.json``; every checkpoint then records, under
``checkpoint["layerdrop"]``::

    tokenizer   {file: "tokenizer.json", sha256, vocab_size, eos_token, eos_id}
    data_dir    the prepared data folder, as an absolute path (or its URL)

``find_tokenizer(ckpt)`` looks, in order, in: an exported folder; the checkpoint's
own folder (the copy above); the recorded absolute data folder; and, for checkpoints
written before this record existed, the data folder as the run named it (relative to
the working directory) and the folders above the checkpoint. A file whose sha256
differs from the recorded one is passed over (and named in the error).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

import lightning.pytorch as pl

from framework.checkpoint import CKPT_KEY, TOKENIZER_FILE, CheckpointError, checkpoint_form, read_metadata
from framework.manifest import sha256_of


def _is_url(path: str) -> bool:
    return "://" in path or path.startswith("local:")


class KeepTokenizer(pl.Callback):
    """Copies the data's tokenizer beside the checkpoints at fit start and records it
    (with its sha256, and the data folder as an absolute path) in every checkpoint.

    A run resumed in a folder whose tokenizer.json differs from the data's stops
    before its first step: its token ids would mean other strings.
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
        self.data_dir = data_dir if _is_url(data_dir) else os.path.abspath(data_dir)
        entry = manifest["tokenizer"]
        self.source = f"{self.data_dir}/{entry.get('file', TOKENIZER_FILE)}"
        self.record = {"file": TOKENIZER_FILE, "sha256": self._sha256(), "vocab_size": entry.get("vocab_size"),
                       "eos_token": entry.get("eos_token"), "eos_id": entry.get("eos_id")}

    def _sha256(self) -> str | None:
        if _is_url(self.source):
            import fsspec

            with fsspec.open(self.source, "rb") as handle:
                return hashlib.sha256(handle.read()).hexdigest()
        return sha256_of(self.source) if os.path.isfile(self.source) else None

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        folder = getattr(trainer.checkpoint_callback, "dirpath", None)
        if self.record is None or self.record["sha256"] is None or not folder or _is_url(str(folder)):
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
        partial = self.kept.with_name(f".{TOKENIZER_FILE}.partial")
        if _is_url(self.source):
            import fsspec

            with fsspec.open(self.source, "rb") as source, open(partial, "wb") as target:
                shutil.copyfileobj(source, target)
        else:
            shutil.copyfile(self.source, partial)
        os.replace(partial, self.kept)

    def on_save_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict) -> None:
        if self.record is not None:
            checkpoint.setdefault(CKPT_KEY, {}).update({"tokenizer": dict(self.record), "data_dir": self.data_dir})


# ------------------------------------------------------------------ finding it again


def tokenizer_record(ckpt_path: str | os.PathLike) -> dict[str, Any]:
    """The recorded tokenizer entry of a checkpoint (any form), or {}."""
    path = Path(ckpt_path)
    try:
        metadata = read_metadata(path)
    except CheckpointError:
        return {}
    entry = metadata.get("tokenizer") if checkpoint_form(path) in ("exported", "hf") else \
        (metadata.get(CKPT_KEY) or {}).get("tokenizer")
    return dict(entry) if isinstance(entry, dict) else {}


def find_tokenizer(ckpt_path: str | os.PathLike) -> Path:
    """tokenizer.json of the checkpoint at ``ckpt_path``; CheckpointError (one line,
    naming every place tried) when there is none."""
    path = Path(ckpt_path)
    form = checkpoint_form(path)
    metadata = read_metadata(path)
    if form in ("exported", "hf"):  # the tokenizer is in the folder (an HF config has no record)
        record = metadata.get("tokenizer") if isinstance(metadata.get("tokenizer"), dict) else {}
        candidates = [path / TOKENIZER_FILE]
    else:
        entry = metadata.get(CKPT_KEY) or {}
        record = entry.get("tokenizer") if isinstance(entry.get("tokenizer"), dict) else {}
        folder = path.parent  # the checkpoint folder, also for last.ckpt as a link
        candidates = [folder / TOKENIZER_FILE]
        data_dirs = [entry.get("data_dir"), (metadata.get("datamodule_hyper_parameters") or {}).get("data_dir")]
        for data_dir in data_dirs:
            if isinstance(data_dir, str) and not _is_url(data_dir):
                candidates.append(_data_tokenizer(Path(data_dir)))
        candidates += [folder.parent / TOKENIZER_FILE, folder.parent.parent / TOKENIZER_FILE]
    tried = []
    for candidate in dict.fromkeys(candidates):
        if not candidate.is_file():
            tried.append(str(candidate))
        elif record.get("sha256") and sha256_of(candidate) != record["sha256"]:
            tried.append(f"{candidate} (sha256 differs from the checkpoint's)")
        else:
            return candidate.resolve()
    raise CheckpointError(f"no tokenizer found for checkpoint {str(path)!r} (tried {', '.join(tried)})")


def _data_tokenizer(data_dir: Path) -> Path:
    """The tokenizer file a prepared data folder's manifest names."""
    manifest = data_dir / "manifest.json"
    try:
        name = json.loads(manifest.read_text()).get("tokenizer", {}).get("file", TOKENIZER_FILE)
    except (OSError, ValueError, AttributeError):
        name = TOKENIZER_FILE
    return data_dir / name


__all__ = ["KeepTokenizer", "find_tokenizer", "tokenizer_record", "sha256_of"]

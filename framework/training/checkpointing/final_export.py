"""``FinalExport``: every pretraining run ends with an export of its final model in
``<default_root_dir>/export/`` (the form framework/checkpoint/export.py writes).

Every rank gathers one tensor at a time (as the strategy's registry entry gathers it,
framework/strategies), global rank 0 streams it to disk. Post-training and eval of a large
run then need neither the sharded checkpoints nor the training world size.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities import rank_zero_info

from framework.files.atomic_write import copy_file
from framework.files.staging import is_url
from framework.checkpoint.base import CONFIG_FILE, TOKENIZER_FILE, WEIGHTS_FILE, CheckpointError
from framework.checkpoint.export import EXPORT_FOLDER, mark_export, write_config
from framework.checkpoint.folder import finish_replacement, publish, remove_path, staging_path
from framework.training.checkpointing.keep_tokenizer import KeepTokenizer
from framework.checkpoint.safetensors_writer import SafetensorsWriter
from framework.training.checkpointing.saving import PeriodicCheckpoint
from framework.strategies import entry_of


class FinalExport(pl.Callback):
    """At the end of training, writes the model as an exported folder to
    ``<default_root_dir>/export/`` (replacing a previous one only once the new one is
    complete). Every rank gathers each tensor in turn; global rank 0 writes it.
    Weights that are not finite are not exported (the run says so in one line).

    The run's final checkpoint is saved first (Lightning calls checkpoint callbacks
    last, after this one): an export that fails or is killed, an OOM gathering a full
    tensor, loses no step. A replacement of ``export/`` interrupted between its two
    renames is finished when the next run starts.

    A run killed during its export has nothing left to train when resumed (Lightning
    then skips the training hooks): at the end of that fit the export is made from the
    restored final checkpoint, before the summary is written (`layerdrop pretrain` puts
    this callback ahead of RunSummary)."""

    def __init__(self) -> None:
        self.exported = False  # this fit wrote (or tried to write) the export

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        root = str(trainer.default_root_dir)
        if trainer.is_global_zero and not is_url(root):
            finish_replacement(Path(root) / EXPORT_FOLDER)

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        root = str(trainer.default_root_dir)
        if self.exported or is_url(root) or trainer.max_steps < 1 or trainer.global_step < trainer.max_steps:
            return
        for callback in trainer.checkpoint_callbacks:
            if isinstance(callback, PeriodicCheckpoint):
                callback.settle(trainer)  # last.ckpt on the checkpoint the export is made from
        out = Path(root) / EXPORT_FOLDER
        missing = None
        if trainer.is_global_zero:
            finish_replacement(out)  # a replacement cut between its renames; a killed export's staging
            missing = _missing(out, trainer.global_step)
        missing = trainer.strategy.broadcast(missing)
        if missing:
            rank_zero_info(f"final export: {out} {missing} (the run stopped before its export was done); making it now")
            self.export(trainer, pl_module)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        for callback in trainer.checkpoint_callbacks:
            if isinstance(callback, PeriodicCheckpoint):
                callback.save_final(trainer)
        self.export(trainer, pl_module)

    def export(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Gather and write the model to ``<default_root_dir>/export`` (every rank calls it)."""
        self.exported = True
        root = str(trainer.default_root_dir)
        if is_url(root):
            rank_zero_info(f"final export skipped: {root} is not a local folder (run `layerdrop export` later)")
            return
        started = (time.perf_counter(), time.process_time())
        out = Path(root) / EXPORT_FOLDER
        staging = staging_path(out)
        tensors = pl_module.model.state_dict(keep_vars=True)
        strategy = entry_of(trainer.strategy)
        specs = [(name, strategy.export_dtype(t), strategy.full_shape(t)) for name, t in tensors.items()]
        writer, non_finite, failed = None, [], None
        if trainer.is_global_zero:
            remove_path(staging)
            staging.mkdir(parents=True)
            writer = SafetensorsWriter(staging / WEIGHTS_FILE, specs).__enter__()
        for name, tensor in tensors.items():
            full = strategy.full_tensor(tensor)  # a collective: every rank, in the same order
            if writer is None:
                continue
            try:  # a failed write must not stop rank 0 from taking part in the next gather
                full = full.detach().to("cpu", strategy.export_dtype(tensor))
                if full.is_floating_point() and not bool(torch.isfinite(full).all()):
                    non_finite.append(name)
                writer.write(name, full)
            except (OSError, CheckpointError) as err:
                writer.__exit__(type(err), None, None)
                writer, failed = None, err
        if writer is not None:
            writer.__exit__(None, None, None)
            self._finish(trainer, pl_module, staging, out, non_finite,
                         time.perf_counter() - started[0], time.process_time() - started[1])
        elif failed is not None:
            remove_path(staging)
            print(f"final export failed: {failed}", file=sys.stderr, flush=True)
        trainer.strategy.barrier("final_export")

    def _finish(self, trainer: pl.Trainer, pl_module: pl.LightningModule, staging: Path, out: Path,
                non_finite: list[str], seconds: float, cpu_seconds: float) -> None:
        if non_finite:
            remove_path(staging)
            print(f"final export skipped: {len(non_finite)} tensors are not finite (the first {non_finite[0]})",
                  file=sys.stderr, flush=True)
            return
        config = {"model": pl_module.model_cfg.to_dict(),
                  "training": {"global_step": trainer.global_step, "layer_dropout": asdict(pl_module.dropout_cfg),
                               "parametrization": asdict(pl_module.param_cfg)}}
        keeper = next((cb for cb in trainer.callbacks if isinstance(cb, KeepTokenizer)), None)
        kept = getattr(keeper, "kept", None) or (Path(keeper.source) if keeper and keeper.source else None)
        if kept is not None and kept.is_file():
            copy_file(kept, staging / TOKENIZER_FILE)
            config["tokenizer"] = dict(keeper.record)
        else:
            print("final export: no tokenizer found for the run's data; the export holds the weights alone",
                  file=sys.stderr, flush=True)
        write_config(staging, config)
        mark_export(staging)
        publish(staging, out)
        rank_zero_info(f"exported the final model to {out} (model.safetensors + config.json"
                       + (" + tokenizer.json)" if "tokenizer" in config else ")")
                       + f" in {seconds:.2f} s, {cpu_seconds:.2f} CPU s on rank 0")


def _missing(out: Path, step: int) -> str | None:
    """Why ``out`` is not this run's export of step ``step`` (None when it is, or when it
    records no step: then it is left as it is). A run lengthened with a larger max_steps
    and killed while exporting keeps the export of its earlier end until the new one
    replaces it."""
    if not out.is_dir():
        return "is missing"
    exported = exported_step(out)
    return None if exported in (None, step) else f"holds step {exported}, not step {step}"


def exported_step(out: str | Path) -> int | None:
    """The optimizer step a run's final export was made at (None: no export, or none that says)."""
    try:
        step = json.loads((Path(out) / CONFIG_FILE).read_text())["training"]["global_step"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return step if isinstance(step, int) else None


def export_callbacks() -> list[pl.Callback]:
    """What `layerdrop pretrain` adds to every run: the tokenizer kept beside the
    checkpoints (and recorded in them), and the export at the end."""
    return [KeepTokenizer(), FinalExport()]


__all__ = ["FinalExport", "export_callbacks", "exported_step"]

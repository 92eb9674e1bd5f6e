"""Checkpoints of a pretraining run: periodic saves (keep-last-k), atomic single-file
writes, and the refusal to write over an earlier run's checkpoints."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.fabric.plugins import TorchCheckpointIO


class PeriodicCheckpoint(pl.callbacks.ModelCheckpoint):
    """``step-XXXXXXXX.ckpt`` every ``every_n_steps`` optimizer steps (the newest
    ``keep_last`` kept) and ``last.ckpt``, in ``<default_root_dir>/checkpoints`` unless
    ``dirpath`` says otherwise. The final step is always saved.

    A new run refuses a folder that already holds checkpoints (resume it instead, or
    pick another folder): nothing on disk is overwritten unasked.
    """

    def __init__(self, every_n_steps: int = 1000, keep_last: int = 3, dirpath: str | None = None) -> None:
        for name, value in (("every_n_steps", every_n_steps), ("keep_last", keep_last)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"checkpoint.{name}={value!r} is invalid: must be a positive integer")
        # Keep-last-k is top-k on the step counter, the newest being the "best".
        super().__init__(dirpath=dirpath, filename="step-{step:08d}", monitor="step", mode="max",
                         save_top_k=keep_last, every_n_train_steps=every_n_steps, save_last=True,
                         auto_insert_metric_name=False, enable_version_counter=False)

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self.dirpath is None:
            self.dirpath = os.path.realpath(os.path.join(trainer.default_root_dir, "checkpoints"))
        super().setup(trainer, pl_module, stage)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # The first hook where every strategy has resolved trainer.ckpt_path, and still
        # before anything is written.
        if trainer.ckpt_path is None:
            refuse_earlier_checkpoints(self.dirpath)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._last_global_step_saved != trainer.global_step and not self._should_skip_saving_checkpoint(trainer):
            candidates = self._monitor_candidates(trainer)
            self._save_topk_checkpoint(trainer, candidates)
            self._save_last_checkpoint(trainer, candidates)


class AtomicCheckpointIO(TorchCheckpointIO):
    """Writes a local checkpoint to a temporary file beside it, fsyncs, then renames it
    over the target, so a crash mid-save leaves the previous file whole.

    Lightning's own save goes through an fsspec transaction whose temporary file lives
    in the system temp folder: when that is another filesystem the final move is a
    copy into the target, and a crash during it truncates the previous checkpoint.
    Remote paths (s3://, gs://, ...) keep Lightning's behaviour.
    """

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
        if storage_options is not None or "://" in str(path):
            return super().save_checkpoint(checkpoint, path, storage_options)
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f".{target.name}.partial-{os.getpid()}")
        try:
            with open(partial, "wb") as handle:
                torch.save(checkpoint, handle)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(partial, target)
        finally:
            partial.unlink(missing_ok=True)
        _fsync_dir(target.parent)


def _fsync_dir(folder: Path) -> None:
    """Make the rename itself durable (POSIX; a no-op where directories cannot be opened)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def use_atomic_checkpoint_io(trainer: pl.Trainer) -> None:
    """Swap the strategy's plain TorchCheckpointIO for the atomic one (strategies with
    their own format, e.g. DeepSpeed or sharded FSDP checkpoints, are left alone)."""
    if type(trainer.strategy.checkpoint_io) is TorchCheckpointIO:
        trainer.strategy.checkpoint_io = AtomicCheckpointIO()


def refuse_earlier_checkpoints(dirpath: str | os.PathLike) -> None:
    """A fresh run must not write over the checkpoints of an earlier one."""
    existing = sorted(Path(dirpath).glob("*.ckpt")) if os.path.isdir(dirpath) else []
    if existing:
        raise ValueError(f"checkpoint folder {str(dirpath)!r} already holds {existing[0].name} from an earlier "
                         "run: resume it (--resume auto) or choose another --trainer.default_root_dir")



__all__ = ["PeriodicCheckpoint", "AtomicCheckpointIO", "use_atomic_checkpoint_io", "refuse_earlier_checkpoints"]

"""Checkpoints of a pretraining run: crash-safe periodic saves (keep-last-k) for every
strategy, atomic single-file writes, and the refusal to write over an earlier run's
checkpoints. Choosing the checkpoint to resume from is framework/resume.py."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any
from weakref import proxy

import lightning.pytorch as pl
import torch
from lightning.fabric.plugins import TorchCheckpointIO

from framework.checkpoint_folder import (clean_leftovers, fsync_dir, point_last, publish, remove_path, retire,
                                         staging_path)
from framework.nonfinite import guard_of, refuse_nonfinite_state


class PeriodicCheckpoint(pl.callbacks.ModelCheckpoint):
    """``step-XXXXXXXX.ckpt`` every ``every_n_steps`` optimizer steps (the newest
    ``keep_last`` kept) and ``last.ckpt``, a link to the newest, in
    ``<default_root_dir>/checkpoints`` unless ``dirpath`` says otherwise. The final step
    is always saved. The folder must be local (the link and the renames need it).

    Every save is crash-safe whatever the strategy (a single file, FSDP2's folder of
    shards, DeepSpeed's folder): it is written under a staging name, every rank waits
    for every other, then rank 0 renames it into place (framework/checkpoint_folder.py).
    Before a save, the parameters and optimizer state are checked on every rank: a
    state with a NaN or Inf is never written (the run stops instead).

    A new run refuses a folder that already holds checkpoints (resume it instead, or
    pick another folder): nothing on disk is overwritten unasked.
    """

    def __init__(self, every_n_steps: int = 1000, keep_last: int = 3, dirpath: str | None = None) -> None:
        for name, value in (("every_n_steps", every_n_steps), ("keep_last", keep_last)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"checkpoint.{name}={value!r} is invalid: must be a positive integer")
        # Keep-last-k is top-k on the step counter, the newest being the "best". "link":
        # last.ckpt points at the newest step file instead of being a second copy.
        super().__init__(dirpath=dirpath, filename="step-{step:08d}", monitor="step", mode="max",
                         save_top_k=keep_last, every_n_train_steps=every_n_steps, save_last="link",
                         auto_insert_metric_name=False, enable_version_counter=False)
        # (step, path) of the checkpoints this run wrote or resumed from, each checked
        # finite: what the non-finite guard can recommend.
        self.finite_checkpoints: list[tuple[int, str]] = []

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self.dirpath is None:
            self.dirpath = os.path.realpath(os.path.join(trainer.default_root_dir, "checkpoints"))
        super().setup(trainer, pl_module, stage)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # The first hook where every strategy has resolved trainer.ckpt_path and loaded
        # it, and still before anything is written.
        super().on_train_start(trainer, pl_module)
        if trainer.ckpt_path is None:
            refuse_earlier_checkpoints(self.dirpath)
        else:
            refuse_nonfinite_state(trainer, f"checkpoint {str(trainer.ckpt_path)!r}",
                                   "it cannot be resumed: resume from an earlier checkpoint")
            self.finite_checkpoints.append((trainer.global_step, str(trainer.ckpt_path)))
        if trainer.is_global_zero:
            clean_leftovers(self.dirpath)
        trainer.strategy.barrier("PeriodicCheckpoint.on_train_start")

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._last_global_step_saved != trainer.global_step and not self._should_skip_saving_checkpoint(trainer):
            candidates = self._monitor_candidates(trainer)
            self._save_topk_checkpoint(trainer, candidates)
            self._save_last_checkpoint(trainer, candidates)

    def _save_topk_checkpoint(self, trainer: pl.Trainer, monitor_candidates: dict[str, Any]) -> None:
        # While steps are being skipped for non-finite values the weights are those that
        # produced them: a save then would push the checkpoints from before out of the
        # keep-last window. It is left out (the final save of a run is not).
        if guard_of(trainer).in_a_row and not trainer.fit_loop.done:
            if trainer.is_global_zero:
                print(f"step {trainer.global_step}: no checkpoint while steps are being skipped for non-finite "
                      "values", file=sys.stderr, flush=True)
            return
        super()._save_topk_checkpoint(trainer, monitor_candidates)

    def _save_checkpoint(self, trainer: pl.Trainer, filepath: str) -> None:
        """Lightning's save, into a staging name; published once every rank is done."""
        refuse_nonfinite_state(trainer, f"the state at step {trainer.global_step}",
                               f"it was not saved to {filepath}")
        staging = staging_path(filepath)
        if trainer.is_global_zero:
            remove_path(staging)  # a leftover of a killed save of this very step
        trainer.strategy.barrier("PeriodicCheckpoint.staging")
        trainer.save_checkpoint(staging, self.save_weights_only)  # returns after a barrier: every rank wrote
        if trainer.is_global_zero:
            publish(staging, filepath)
        trainer.strategy.barrier("PeriodicCheckpoint.publish")
        self._last_global_step_saved = trainer.global_step
        self._last_checkpoint_saved = filepath
        self.finite_checkpoints.append((trainer.global_step, filepath))
        if trainer.is_global_zero:
            for logger in trainer.loggers:
                logger.after_save_checkpoint(proxy(self))

    @staticmethod
    def _link_checkpoint(trainer: pl.Trainer, filepath: str, linkpath: str) -> None:
        # Lightning's own version deletes last.ckpt before creating the new link.
        if trainer.is_global_zero and os.path.abspath(filepath) != os.path.abspath(linkpath):
            point_last(filepath, linkpath)
        trainer.strategy.barrier("PeriodicCheckpoint.link")

    def _remove_checkpoint(self, trainer: pl.Trainer, filepath: str) -> None:
        if trainer.is_global_zero:
            retire(filepath)

    def newest_finite_checkpoint(self, before_step: int | None = None) -> str | None:
        """The newest checkpoint still on disk that was checked finite, optionally one
        saved before optimizer step ``before_step``."""
        for step, path in sorted(self.finite_checkpoints, reverse=True):
            if (before_step is None or step < before_step) and os.path.exists(path):
                return path
        return None


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
        fsync_dir(target.parent)


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

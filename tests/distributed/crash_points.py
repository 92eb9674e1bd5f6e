"""Test-only callbacks for the crash tests: kill -9 a run at an exact point of its
checkpointing (or fill its disk there, on one rank), and record every rank's per-step
losses.

Given to ``layerdrop pretrain`` through a recipe's ``trainer.callbacks`` (class paths,
with this folder on PYTHONPATH), so production code carries no test hooks: the
points "during a save" are reached by wrapping, from here, the functions a save goes
through (``torch.save``, which writes the single file and every FSDP2 shard, and the
steps of framework/checkpoint/folder.py).

The kill is SIGKILL to the run's whole process group: every rank dies at that
instant, as when a node fails or a job is cancelled.
"""

from __future__ import annotations

import errno
import io
import json
import os
import signal
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch

POINTS = ("before_save", "during_save", "before_publish", "before_link", "during_retire", "after_save",
          "during_export")


def kill_the_run() -> None:
    os.killpg(os.getpgrp(), signal.SIGKILL)


class KillAt(pl.Callback):
    """Kill the run at ``point`` of optimizer step ``step`` (on global rank ``rank``):

        before_save     at the end of step ``step``, before its checkpoint is started
        during_save     half-way through the first file the save of ``step`` writes
        before_publish  every rank has written the save of ``step``; not yet renamed
        before_link     ``step``'s checkpoint is in place; last.ckpt not yet repointed
        during_retire   while the checkpoint that ``step``'s save pushed out is deleted
        after_save      one step after the save of ``step`` completed
        during_export   the end-of-run export, after its first tensor is written
    """

    def __init__(self, step: int, point: str, rank: int = 0) -> None:
        if point not in POINTS:
            raise ValueError(f"point={point!r}: allowed {POINTS}")
        self.step, self.point, self.rank = step, point, rank
        self._armed = False

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if trainer.global_rank != self.rank:
            return
        import framework.checkpoint.folder as folder
        import framework.training.checkpointing.saving as checkpointing

        if self.point == "during_save":
            torch.save = self._half_then_kill(torch.save)
        elif self.point == "before_publish":
            checkpointing.publish = self._kill_before(checkpointing.publish)
        elif self.point == "before_link":
            checkpointing.point_last = self._kill_before(checkpointing.point_last)
        elif self.point == "during_retire":
            folder.remove_path = self._kill_on_deleting(folder.remove_path)
        elif self.point == "during_export":
            from framework.checkpoint.safetensors_writer import SafetensorsWriter

            write = SafetensorsWriter.write

            def write_then_kill(writer, *args, **kwargs):
                write(writer, *args, **kwargs)
                kill_the_run()
            SafetensorsWriter.write = write_then_kill

    def on_save_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict) -> None:
        # Called while the checkpoint is assembled, before anything is written.
        self._armed = trainer.global_step == self.step

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        # Runs before PeriodicCheckpoint's hook (Lightning orders Checkpoint callbacks last).
        if self.point == "before_save" and trainer.global_step == self.step and trainer.global_rank == self.rank:
            kill_the_run()

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        if self.point == "after_save" and trainer.global_step == self.step + 1 and trainer.global_rank == self.rank:
            kill_the_run()

    def _kill_before(self, function):
        def wrapped(*args, **kwargs):
            if self._armed:
                kill_the_run()
            return function(*args, **kwargs)
        return wrapped

    def _kill_on_deleting(self, function):
        def wrapped(path, *args, **kwargs):
            if self._armed and str(path).endswith(".deleting") and os.path.lexists(path):
                kill_the_run()
            return function(path, *args, **kwargs)
        return wrapped

    def _half_then_kill(self, save):
        def wrapped(obj, f, *args, **kwargs):
            if not self._armed:
                return save(obj, f, *args, **kwargs)
            buffer = io.BytesIO()
            save(obj, buffer, *args, **kwargs)
            data = buffer.getvalue()[: len(buffer.getvalue()) // 2]
            if hasattr(f, "write"):
                f.write(data)
                f.flush()
            else:
                Path(f).write_bytes(data)
            self._stop()
        return wrapped

    def _stop(self) -> None:
        kill_the_run()


class DiskFullAt(KillAt):
    """The disk fills on global rank ``rank`` alone, half-way through the first file the
    save of optimizer step ``step`` writes there (the single file under DDP, this rank's
    shard under FSDP2), or through the file named ``file`` (FSDP2's ``meta.pt``, which
    rank 0 writes alone after the shards): ENOSPC, as a full disk answers; the run goes
    on to handle it."""

    def __init__(self, step: int, rank: int = 0, file: str | None = None) -> None:
        super().__init__(step, "during_save", rank)
        self.file = file

    def _half_then_kill(self, save):
        cut = super()._half_then_kill(save)

        def wrapped(obj, f, *args, **kwargs):
            name = str(getattr(f, "name", f))
            if self.file is not None and not name.endswith(self.file):
                return save(obj, f, *args, **kwargs)
            return cut(obj, f, *args, **kwargs)
        return wrapped

    def _stop(self) -> None:
        self._armed = False
        raise OSError(errno.ENOSPC, "No space left on device")


class PoisonGradient(pl.Callback):
    """Makes one gradient element infinite on global rank ``rank`` at optimizer step
    ``step`` (after backward, before the optimizer step): a non-finite gradient on one
    rank only, which every rank must agree to skip."""

    def __init__(self, step: int, rank: int) -> None:
        self.step, self.rank = step, rank

    def on_after_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.global_step != self.step or trainer.global_rank != self.rank:
            return
        grad = next(p.grad for p in pl_module.parameters() if p.grad is not None)
        local = grad.to_local() if hasattr(grad, "to_local") else grad
        local.view(-1)[0] = float("inf")


def skipped_line(step: int, rank: int = 1) -> str:
    """What a run prints when every rank skipped ``step`` for a non-finite gradient on ``rank``."""
    return f"step {step} (batch {step}): non-finite gradient norm on rank {rank}; skipped"


class RecordLosses(pl.Callback):
    """Appends {"step", "loss", "weights"} of every optimizer step to
    ``<out_dir>/rank<R>.jsonl``: the exact loss, and the sum of this rank's parameters
    (its shards under FSDP2) after the step. Opened and closed each time, so a killed
    run keeps its lines."""

    def __init__(self, out_dir: str) -> None:
        self.out_dir = Path(out_dir)

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        weights = sum(float((p.to_local() if hasattr(p, "to_local") else p).detach().double().sum())
                      for p in pl_module.parameters())
        self.out_dir.mkdir(parents=True, exist_ok=True)
        with open(self.out_dir / f"rank{trainer.global_rank}.jsonl", "a") as handle:
            handle.write(json.dumps({"step": trainer.global_step - 1, "loss": float(loss), "weights": weights}) + "\n")


def read_records(out_dir: Path, rank: int = 0) -> list[dict[str, Any]]:
    path = Path(out_dir) / f"rank{rank}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def read_losses(out_dir: Path, rank: int = 0) -> list[tuple[int, float]]:
    return [(r["step"], r["loss"]) for r in read_records(out_dir, rank)]

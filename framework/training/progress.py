"""A pretraining run's progress: on a terminal a bar in optimizer steps, in a log a line
every N seconds (the line's format and parser: framework/console/progress_line.py).

A run bounded by ``max_steps`` (``max_epochs`` left at -1) makes Lightning's own bar
read "Epoch 0/-2" with an epoch of batches as its total, which a streamed data set may
never reach; ``StepProgressBar`` reads "Step", out of ``max_steps``, from the step a
resumed run starts at. A bar draws nothing into a file, so a run whose stdout is not a
terminal gets ``StepProgressLines`` as well.
"""

from __future__ import annotations

import math
import sys
import time
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import RichProgressBar

from framework.training.callbacks import micro_batch_stats
from framework.console.progress_line import ProgressLine, format_progress_line
from framework.training.data.source_tokens import SourceTokens


class StepProgressBar(RichProgressBar):
    """Lightning's rich bar, in optimizer steps out of ``max_steps`` when the run is
    bounded by steps (public hooks and attributes only: no private Lightning calls)."""

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        super().on_train_epoch_start(trainer, pl_module)
        self._show_steps(trainer)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        self._show_steps(trainer)

    def _show_steps(self, trainer) -> None:
        by_steps = trainer.max_steps is not None and trainer.max_steps > 0 and trainer.max_epochs in (None, -1)
        if not by_steps or self.progress is None or self.train_progress_bar_id is None:
            return
        label = f"Step {trainer.global_step}/{trainer.max_steps}"
        style = self.theme.description
        self.progress.update(self.train_progress_bar_id, completed=trainer.global_step, total=trainer.max_steps,
                             description=f"[{style}]{label}" if style else label)
        self.refresh()


class StepProgressLines(pl.Callback):
    """One progress line on stdout (global rank 0) after the first optimizer step, then
    every ``every`` seconds, and after the last step.

    Args:
        every: seconds between lines (0: after every step).
        loss: the logged metric the line shows as its loss (`adapters fit`: its KL).
    """

    def __init__(self, every: float = 30.0, loss: str = "train/loss") -> None:
        if not every >= 0:
            raise ValueError(f"progress_every={every!r} is invalid: must be a number of seconds >= 0")
        self.every, self.loss = every, loss

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._started = self._window_start = time.perf_counter()
        self._first_step = self._seen_step = trainer.global_step
        self._last_line: float | None = None
        self._tokens = 0
        self._paused_at: float | None = None

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any,
                           batch: Any, batch_idx: int) -> None:
        stats = micro_batch_stats(outputs)
        self._tokens += stats.tokens if stats is not None else _input_tokens(batch)
        if trainer.global_step == self._seen_step:  # inside an accumulation (or a skipped step)
            return
        self._seen_step = trainer.global_step
        now = time.perf_counter()
        due = self._last_line is None or now - self._last_line >= self.every
        if due or trainer.global_step >= trainer.max_steps:
            self._print(trainer, now)

    def _print(self, trainer: pl.Trainer, now: float) -> None:
        window = now - self._window_start
        tokens_per_sec = self._tokens * trainer.world_size / window if window > 0 else 0.0
        self._last_line, self._window_start, self._tokens = now, now, 0
        if not trainer.is_global_zero:
            return
        done = trainer.global_step - self._first_step
        remaining = max(0, trainer.max_steps - trainer.global_step)
        loss = trainer.callback_metrics.get(self.loss)
        counter = next((cb for cb in trainer.callbacks if isinstance(cb, SourceTokens)), None)
        line = ProgressLine(step=trainer.global_step, total=trainer.max_steps,
                            loss=float(loss) if loss is not None else math.nan, tokens_per_sec=tokens_per_sec,
                            eta_seconds=int((now - self._started) / done * remaining) if done else 0,
                            sources=counter.describe(trainer) if counter is not None else None)
        print(format_progress_line(line), file=sys.stdout, flush=True)

    # Validation is not training throughput: the tokens/s window stops while it runs.
    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.training and hasattr(self, "_window_start"):
            self._paused_at = time.perf_counter()

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if getattr(self, "_paused_at", None) is not None:
            self._window_start += time.perf_counter() - self._paused_at
            self._paused_at = None


def _input_tokens(batch: Any) -> int:
    """Tokens of a (inputs, targets) batch (a module whose step reports no stats)."""
    inputs = batch[0] if isinstance(batch, (tuple, list)) else batch
    return int(inputs.numel()) if hasattr(inputs, "numel") else 0


__all__ = ["StepProgressBar", "StepProgressLines"]

"""The non-finite-loss guard: a NaN or Inf training loss stops the run before a
checkpoint of that state is written."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch


class NonFiniteLossError(RuntimeError):
    """The training loss became NaN or Inf; the run stopped before saving that state."""



class NonFiniteLossGuard(pl.Callback):
    """Stops the run at the first NaN/Inf training loss on any device, before a
    checkpoint of that state can be written (ModelCheckpoint always runs last)."""

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any,
                           batch: Any, batch_idx: int) -> None:
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        bad = loss is not None and not bool(torch.isfinite(loss.detach()).all())
        if not trainer.strategy.reduce_boolean_decision(bad, all=False):
            return
        last = trainer.checkpoint_callback.last_model_path if trainer.checkpoint_callback else ""
        where = f"the last good checkpoint is {last}" if last else "no checkpoint was written yet"
        value = loss.item() if bad else "finite here, non-finite on another device"
        position = getattr(pl_module, "schedule_position", None)  # the step this loss belongs to
        step = position[0] if position else trainer.global_step
        raise NonFiniteLossError(f"training loss is {value} at step {step} "
                                 f"(micro-batch {batch_idx}); the run stopped and {where}. "
                                 "Lower the learning rate or check the data, then resume.")



__all__ = ["NonFiniteLossGuard", "NonFiniteLossError"]

"""The training progress bar: Lightning's rich bar, counted in optimizer steps.

A run bounded by ``max_steps`` (``max_epochs`` left at -1) makes Lightning's own bar
read "Epoch 0/-2" with an epoch of batches as its total, which a streamed data set may
never reach; this one reads "Step", out of ``max_steps``, from the step a resumed run
starts at.
"""

from __future__ import annotations

from lightning.pytorch.callbacks import RichProgressBar


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


__all__ = ["StepProgressBar"]

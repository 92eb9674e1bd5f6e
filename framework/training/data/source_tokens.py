"""Tokens trained on per source of a data mixture, summed over ranks.

Each rank counts the rows of its batches by source (the batch's third tensor, see
framework/training/data/data_module.py); after every optimizer step the counts since the last
sum are added up over ranks (one all-reduce of a few integers, next to the step's gradient
all-reduce), so the progress line always shows the whole job's tokens, and every
``trainer.log_every_n_steps`` steps they are logged as ``train/tokens/<source>`` (TensorBoard)
beside each source's share so far. The totals go
into checkpoints (a resumed run goes on counting) and into ``summary.json``
(``data.sources.<name>.tokens``) with each source's last validation loss and the mixture's
phases.
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch


class SourceTokens(pl.Callback):
    """Per-source token counts of a mixture run (a no-op for one folder)."""

    def __init__(self) -> None:
        self.totals: list[int] = []  # summed over ranks, up to the last sum
        self._pending: torch.Tensor | None = None  # this rank's rows since the last sum

    @staticmethod
    def _sources(trainer: pl.Trainer) -> list | None:
        return getattr(trainer.datamodule, "sources", None) if trainer.datamodule is not None else None

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        sources = self._sources(trainer)
        if sources is not None and len(self.totals) != len(sources):
            self.totals = [0] * len(sources)

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if not self.totals or len(batch) != 3:
            return
        inputs, _, sources = batch
        rows = torch.bincount(sources.detach().cpu(), minlength=len(self.totals))
        self._pending = rows if self._pending is None else self._pending + rows
        if (batch_idx + 1) % trainer.accumulate_grad_batches == 0:  # the step's last micro-batch
            self._sum(trainer, seq_len=inputs.shape[1])
            if trainer.global_step % trainer.log_every_n_steps == 0:
                self._log(trainer)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.totals:
            seq_len = trainer.datamodule.seq_len
            self._sum(trainer, seq_len)  # collective: every rank ends the fit here

    def _sum(self, trainer: pl.Trainer, seq_len: int) -> None:
        pending = self._pending if self._pending is not None else torch.zeros(len(self.totals), dtype=torch.int64)
        device = trainer.strategy.root_device
        summed = trainer.strategy.reduce(pending.to(device) * seq_len, reduce_op="sum")
        self.totals = [total + int(count) for total, count in zip(self.totals, summed.tolist())]
        self._pending = None

    def _log(self, trainer: pl.Trainer) -> None:
        if trainer.logger is None or not trainer.is_global_zero:
            return
        sources, all_tokens = self._sources(trainer), max(1, sum(self.totals))
        metrics = {}
        for source, tokens in zip(sources, self.totals):
            metrics[f"train/tokens/{source.name}"] = float(tokens)
            metrics[f"train/share/{source.name}"] = tokens / all_tokens
        trainer.logger.log_metrics(metrics, step=trainer.global_step)

    def describe(self, trainer: pl.Trainer) -> str | None:
        """'code 1.2M (31%), prose 2.6M (69%)': for the progress line (None for one folder)."""
        sources = self._sources(trainer)
        if not self.totals or sources is None:
            return None
        all_tokens = max(1, sum(self.totals))
        return ", ".join(f"{source.name} {_short(tokens)} ({tokens / all_tokens:.0%})"
                         for source, tokens in zip(sources, self.totals))

    def summary(self, trainer: pl.Trainer, metrics: dict[str, float]) -> dict[str, Any]:
        """``{"data": {"sources": {name: {dir, weight, tokens, val_loss}}, "phases": [...]}}``
        (``val_loss`` from ``metrics``, the last validation's ``val/*``); empty for one folder."""
        sources = self._sources(trainer)
        if sources is None:
            return {}
        entries = {}
        for index, source in enumerate(sources):
            val = metrics.get(f"val/loss/{source.name}")
            entries[source.name] = {"dir": source.dir, "weight": source.weight,
                                    "tokens": self.totals[index] if self.totals else 0,
                                    "val_loss": float(val) if val is not None else None}
        phases = trainer.datamodule.phases.state()
        if phases and phases[-1]["end_step"] is None:
            phases[-1]["end_step"] = trainer.global_step
        return {"data": {"sources": entries, "phases": phases}}

    def state_dict(self) -> dict[str, Any]:
        return {"totals": list(self.totals)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.totals = [int(total) for total in state_dict.get("totals", [])]


def _short(tokens: int) -> str:
    for scale, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if tokens >= scale:
            return f"{tokens / scale:.1f}{suffix}"
    return str(tokens)


__all__ = ["SourceTokens"]

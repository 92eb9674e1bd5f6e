"""Test-only callback: what each rank of a multi-process run did, written to JSON.

Per optimizer step: the training loss, and the number of rows every block was
*called* on (a forward pre-hook on each block reads the kept-row index of its drop
plan), so a test sees both that every rank called every block on every step (zero
rows included) and that the ranks drew different masks. At the end: the last value
of every metric this rank handed to its loggers (a capturing logger is added on every
rank; the run's own loggers write on rank 0 only), and optionally its parameters.

Given to ``layerdrop pretrain`` through a recipe: ``trainer.callbacks: [{class_path:
rank_probe.RankProbe, init_args: {out_dir: ...}}]`` with this folder on PYTHONPATH.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.loggers import Logger


class LastValues(Logger):
    """Keeps the last value of every metric it is given, on whichever rank it runs."""

    def __init__(self) -> None:
        super().__init__()
        self.values: dict[str, float] = {}

    @property
    def name(self) -> str:
        return "last_values"

    @property
    def version(self) -> int:
        return 0

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.values.update({k: float(v) for k, v in metrics.items()})

    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        pass


class RankProbe(pl.Callback):
    def __init__(self, out_dir: str, save_parameters: bool = False) -> None:
        self.out_dir = Path(out_dir)
        self.save_parameters = save_parameters
        self.steps: list[dict[str, Any]] = []
        self._calls: list[int] = []
        self._handles: list[Any] = []
        self._logged = LastValues()

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        trainer.loggers = [*trainer.loggers, self._logged]
        for block in pl_module.model.blocks:
            self._handles.append(block.register_forward_pre_hook(self._record_call, with_kwargs=True))

    def _record_call(self, block: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        if not (block.training and torch.is_grad_enabled()):
            return  # validation forwards are not training steps
        if torch._C._current_graph_task_id() != -1:
            return  # activation checkpointing's recomputation, inside backward
        h = args[0]
        drop = args[2] if len(args) > 2 else kwargs.get("drop")
        rows = None if drop is None else drop.attn_rows
        self._calls.append(int(h.shape[0]) if rows is None else int(rows.numel()))

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any,
                           batch: Any, batch_idx: int) -> None:
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        self.steps.append({"step": trainer.global_step, "loss": float(loss.detach()), "rows_per_call": self._calls})
        self._calls = []

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        for handle in self._handles:
            handle.remove()
        logged = self._logged.values
        record = {"rank": trainer.global_rank, "world_size": trainer.world_size, "num_nodes": trainer.num_nodes,
                  "strategy": type(trainer.strategy).__name__, "steps": self.steps, "logged": logged}
        self.out_dir.mkdir(parents=True, exist_ok=True)
        (self.out_dir / f"rank{trainer.global_rank}.json").write_text(json.dumps(record))
        if self.save_parameters:
            state = {name: p.detach().cpu().clone() for name, p in pl_module.model.named_parameters()}
            torch.save(state, self.out_dir / f"parameters-rank{trainer.global_rank}.pt")

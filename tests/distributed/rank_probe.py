"""Test-only callback: what each rank of a multi-process run did, written to JSON.

Per optimizer step: the training loss, and the number of rows every block was
*called* on (a forward pre-hook on each block reads the kept-row index of its drop
plan), so a test sees both that every rank called every block on every step (zero
rows included) and that the ranks drew different masks. At the end: the last value
of every metric this rank handed to its loggers (a capturing logger is added on every
rank; the run's own loggers write on rank 0 only), and optionally its parameters.

With ``record_collectives``, also per step: every c10d collective of the forward and
backward (op, dtype, group size, bytes; benchmarks/comm_volume.py's CollectiveLog,
active from the batch's start to just before the optimizer step) and the dtype of
each block's weights as the block runs (FSDP2 has all-gathered them by then); at the
end the dtypes of the parameters the optimizer steps (FSDP2's sharded master weights)
and of its state.

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

from benchmarks.comm_volume import CollectiveLog


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
    def __init__(self, out_dir: str, save_parameters: bool = False, record_collectives: bool = False) -> None:
        self.out_dir = Path(out_dir)
        self.save_parameters = save_parameters
        self.record_collectives = record_collectives
        self.steps: list[dict[str, Any]] = []
        self._calls: list[int] = []
        self._compute_dtypes: list[str] = []
        self._log: CollectiveLog | None = None
        self._collectives: list[dict[str, Any]] = []
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
        self._compute_dtypes.append(str(block.attn.qkv.weight.dtype).removeprefix("torch."))

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        if self.record_collectives:
            self._log = CollectiveLog()
            self._log.__enter__()

    def on_before_optimizer_step(self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: Any) -> None:
        if self._log is not None:
            self._log.__exit__(None, None, None)
            self._collectives, self._log = self._log.calls, None

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any,
                           batch: Any, batch_idx: int) -> None:
        if self._log is not None:  # a step skipped for a non-finite gradient has no optimizer step
            self.on_before_optimizer_step(trainer, pl_module, None)
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        step = {"step": trainer.global_step, "loss": float(loss.detach()), "rows_per_call": self._calls}
        if self.record_collectives:
            step.update(collectives=self._collectives, compute_dtypes=self._compute_dtypes)
        self.steps.append(step)
        self._calls, self._compute_dtypes, self._collectives = [], [], []

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        for handle in self._handles:
            handle.remove()
        logged = self._logged.values
        record = {"rank": trainer.global_rank, "world_size": trainer.world_size, "num_nodes": trainer.num_nodes,
                  "strategy": type(trainer.strategy).__name__, "steps": self.steps, "logged": logged}
        if self.record_collectives:
            optimizer = trainer.optimizers[0]  # its parameters are the (sharded) master weights
            record["parameter_dtypes"] = sorted({_dtype(p) for group in optimizer.param_groups for p in group["params"]})
            record["optimizer_state_dtypes"] = sorted({_dtype(v) for state in optimizer.state.values()
                                                       for v in state.values() if torch.is_tensor(v) and v.ndim})
        self.out_dir.mkdir(parents=True, exist_ok=True)
        (self.out_dir / f"rank{trainer.global_rank}.json").write_text(json.dumps(record))
        if self.save_parameters:
            state = {name: _full(p) for name, p in pl_module.model.named_parameters()}
            torch.save(state, self.out_dir / f"parameters-rank{trainer.global_rank}.pt")


def _dtype(tensor: torch.Tensor) -> str:
    local = tensor.to_local() if hasattr(tensor, "to_local") else tensor  # a sharded DTensor's own shard
    return str(local.dtype).removeprefix("torch.")


def _full(param: torch.Tensor) -> torch.Tensor:
    """The whole parameter (FSDP2's sharded DTensors are gathered: a collective)."""
    full = param.full_tensor() if hasattr(param, "full_tensor") else param
    return full.detach().cpu().clone()

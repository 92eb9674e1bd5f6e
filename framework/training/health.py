"""Seeing instability before the loss does: per parameter group gradient norm, the
update/weight RMS ratio of the optimizer step, and the largest logit, to TensorBoard.

    health/grad_norm/<group>         ‖g‖ over the group's gradients (what AdamW is handed)
    health/update_rms_ratio/<group>  RMS(Δw)/RMS(w): how far one step moves the weights,
                                     relative to their size (≈ η for AdamW at steady state)
    health/max_logit                 the largest training logit of the step (all devices)

Groups are the parametrization's (framework/training/parametrization.py: hidden, norms_and_biases,
embedding, final_norm, unembedding), so a µP learning rate that is too high for one
group shows in that group. A diverging run shows the update ratio and the max logit
climbing steps before the loss spikes.

Cheap by construction: nothing is computed, copied or synchronised except on the steps
Lightning logs at (``trainer.log_every_n_steps``). On those steps the weights are copied
before the update (one copy of this rank's parameters, freed at the end of the step)
and every number of the step travels in one all-gather. Under FSDP2 each rank holds
shards (DTensors): squared sums are added over ranks; a replicated tensor (DDP, or a
replicated mesh dimension) is counted once. Under DeepSpeed ZeRO the engine keeps the
gradients and (ZeRO-3) the weights to itself: those groups log nothing.
"""

from __future__ import annotations

import math
from typing import Any

import lightning.pytorch as pl
import torch

from framework.training.callbacks import micro_batch_stats, optimizer_step_finished


def is_health_step(trainer: pl.Trainer, step: int) -> bool:
    """Whether optimizer step ``step`` (0-based) is one Lightning logs at (the same rule
    as framework.training.callbacks.log_step_metrics)."""
    return (step + 1) % max(1, trainer.log_every_n_steps) == 0


class TrainingHealth(pl.Callback):
    """Logs the ``health/*`` metrics above once every ``log_every_n_steps`` optimizer
    steps; installed by ``LayerDropModule.configure_callbacks``."""

    def __init__(self) -> None:
        self._names: list[str] = []
        self._params: list[list[torch.nn.Parameter]] = []
        self._replicas: list[list[int]] = []
        self._before: list[list[torch.Tensor]] = []
        self._grad_squares: list[torch.Tensor] = []
        self._max_logit: torch.Tensor | None = None

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any,
                           batch: Any, batch_idx: int) -> None:
        stats = micro_batch_stats(outputs)
        if stats is None or not is_health_step(trainer, stats.step):
            return
        if stats.max_logit is not None:  # the step's largest over its micro-batches
            logit = stats.max_logit.detach().float()
            self._max_logit = logit if self._max_logit is None else torch.maximum(self._max_logit, logit)
        if optimizer_step_finished(trainer, stats):
            self._log(trainer)

    def on_before_optimizer_step(self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: Any) -> None:
        if not is_health_step(trainer, trainer.global_step):
            return
        device = trainer.strategy.root_device
        groups = optimizer.param_groups
        self._names = [str(group.get("name", index)) for index, group in enumerate(groups)]
        self._params = [list(group["params"]) for group in groups]
        self._replicas = [[_replicas(p, trainer) for p in params] for params in self._params]
        self._grad_squares = [
            _squared_sum([_local(p.grad) if p.grad is not None else None for p in params], replicas, device)
            for params, replicas in zip(self._params, self._replicas)]
        self._before = [[_local(p).detach().clone() for p in params] for params in self._params]

    def _log(self, trainer: pl.Trainer) -> None:
        """Every number of the step in one all-gather (a collective: every rank logs on the
        same steps), then to the loggers. A step the guard skipped has no snapshot: only
        the max logit is logged."""
        device = trainer.strategy.root_device
        values = []
        for params, replicas, before, grads in zip(self._params, self._replicas, self._before, self._grad_squares):
            updates = [_local(p).detach() - b for p, b in zip(params, before)]
            values += [grads, _squared_sum(updates, replicas, device), _squared_sum(before, replicas, device)]
        logit = self._max_logit.to(device) if self._max_logit is not None else torch.tensor(-math.inf, device=device)
        local = torch.stack([*(v.double() for v in values), logit.double()])
        gathered = trainer.strategy.all_gather(local) if trainer.world_size > 1 else local[None]
        gathered = gathered.reshape(trainer.world_size, -1).cpu()
        squares = gathered[:, :-1].sum(0).reshape(-1, 3).tolist()
        metrics: dict[str, float] = {}
        for name, params, (grad, update, weight) in zip(self._names, self._params, squares):
            if any(p.grad is not None for p in params):
                metrics[f"health/grad_norm/{name}"] = math.sqrt(grad)
            if weight > 0:
                metrics[f"health/update_rms_ratio/{name}"] = math.sqrt(update / weight)
        top = float(gathered[:, -1].max())
        if math.isfinite(top):
            metrics["health/max_logit"] = top
        if metrics:
            for logger in trainer.loggers:
                logger.log_metrics(metrics, step=trainer.global_step - 1)
        self._names, self._params, self._replicas, self._before, self._grad_squares = [], [], [], [], []
        self._max_logit = None


def _local(tensor: Any) -> torch.Tensor:
    """This rank's part of a DTensor (FSDP2); any other tensor as it is."""
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def _replicas(tensor: Any, trainer: pl.Trainer) -> int:
    """On how many ranks the same values of ``tensor``'s local part live: a DTensor's
    replicated mesh dimensions; a plain tensor on every rank (DDP keeps full copies)."""
    placements = getattr(tensor, "placements", None)
    if placements is None:
        return trainer.world_size
    mesh = tensor.device_mesh
    return math.prod(mesh.size(dim) for dim, placement in enumerate(placements) if placement.is_replicate())


def _squared_sum(tensors: list[torch.Tensor | None], replicas: list[int], device: torch.device) -> torch.Tensor:
    """Σ x² over this rank's part of ``tensors`` (None: no gradient), each divided by its
    replica count so that adding the ranks' values counts every element once; float64
    on ``device``, no host synchronisation."""
    pairs = [(t, r) for t, r in zip(tensors, replicas) if t is not None and t.numel()]
    total = torch.zeros((), dtype=torch.float64, device=device)
    if pairs:
        norms = torch._foreach_norm([t for t, _ in pairs])  # one fused kernel per dtype and device
        for norm, (_, count) in zip(norms, pairs):
            total = total + norm.double().square().to(device) / count
    return total


__all__ = ["TrainingHealth", "is_health_step"]

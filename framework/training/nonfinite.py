"""Non-finite training: a step whose loss or gradient norm is NaN/Inf on any device is
skipped, a run that keeps producing them stops, and no checkpoint ever holds one.

    step t: closure (forward + backward) -> loss, local gradient norms
            every rank learns every rank's verdict (one all-gather of two flags)
            any non-finite: no optimizer update on any rank, gradients dropped,
                            counted (TensorBoard: nonfinite/skipped_steps, nonfinite/in_a_row)
                            and printed; ``max_consecutive_nonfinite`` in a row: stop

``LayerDropModule.optimizer_step`` asks ``NonFiniteLossGuard.skip_step`` before every
update. A skipped step still counts as a step (the data and the LR schedule move
on), as in frameworks that skip overflowing steps. A strategy whose engine runs the
optimizer step itself and cannot skip one (its registry entry's ``can_skip_step``,
framework/strategies) stops the run at the first non-finite step instead. Under a GradScaler (16-mixed) the scaler skips overflowing gradients itself, so
only the loss is checked.

``refuse_nonfinite_state`` is the check before a checkpoint is written (and on the
state a run resumed from): every parameter and optimizer tensor each rank holds (its
own shards under a sharding strategy), agreed over all ranks.
"""

from __future__ import annotations

import sys
from typing import Any, Iterator

import lightning.pytorch as pl
import torch

from framework.config import PositiveInt, check
from framework.strategies import entry_of

DEFAULT_MAX_CONSECUTIVE = 5


class NonFiniteLossError(RuntimeError):
    """Training produced NaN/Inf values too often, or a state to be saved holds some; the
    message names the checkpoint to go back to."""


class NonFiniteLossGuard(pl.Callback):
    """Skips optimizer steps with a non-finite loss or gradient norm; stops the run after
    ``max_consecutive_nonfinite`` of them in a row.

    Args:
        max_consecutive_nonfinite: skipped steps in a row after which the run stops
            (the stop message names the newest checkpoint from before they began).
    """

    def __init__(self, max_consecutive_nonfinite: int = DEFAULT_MAX_CONSECUTIVE) -> None:
        check("guard.max_consecutive_nonfinite", max_consecutive_nonfinite, PositiveInt)
        self.max_consecutive = max_consecutive_nonfinite
        self.skipped_total = 0  # over the whole run, resumes included
        self.in_a_row = 0
        self.streak_start: int | None = None

    def skip_step(self, trainer: pl.Trainer, loss: torch.Tensor | None, optimizer: Any, batch_idx: int) -> bool:
        """True when the optimizer step about to run must be skipped (the same answer on
        every rank); raises NonFiniteLossError when the run must stop. A collective."""
        device = trainer.strategy.root_device
        bad = _gather_flags(trainer, _loss_is_bad(loss, device), _gradients_are_bad(trainer, optimizer))
        if not bad.any():
            self.in_a_row, self.streak_start = 0, None
            return False
        step = trainer.global_step  # the step being taken (counted once it completes)
        if self.streak_start is None:
            self.streak_start = step
        self.in_a_row += 1
        self.skipped_total += 1
        what = _describe(bad)
        entry = entry_of(trainer.strategy)
        if not entry.can_skip_step:
            raise NonFiniteLossError(f"{what} at step {step} (batch {batch_idx}); strategy {entry.name} cannot skip "
                                     f"an optimizer step, so the run stopped. {_advice(trainer, step)}")
        for logger in trainer.loggers:
            logger.log_metrics({"nonfinite/skipped_steps": self.skipped_total, "nonfinite/in_a_row": self.in_a_row},
                               step=step)
        if trainer.is_global_zero:
            print(f"step {step} (batch {batch_idx}): {what}; skipped, no optimizer update "
                  f"({self.in_a_row} in a row, the run stops at {self.max_consecutive}; "
                  f"{self.skipped_total} skipped in all)", file=sys.stderr, flush=True)
        if self.in_a_row >= self.max_consecutive:
            steps = f"{self.in_a_row} steps in a row were" if self.in_a_row > 1 else "1 step was"
            raise NonFiniteLossError(f"{steps} skipped for non-finite values, the limit of "
                                     f"guard.max_consecutive_nonfinite (steps {self.streak_start}..{step}; "
                                     f"the last, batch {batch_idx}: {what}); the run stopped. "
                                     f"{_advice(trainer, self.streak_start)}")
        return True

    def state_dict(self) -> dict[str, Any]:
        return {"skipped_total": self.skipped_total}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.skipped_total = int(state_dict.get("skipped_total", 0))


def guard_of(trainer: pl.Trainer) -> NonFiniteLossGuard:
    """The run's guard: the one among the Trainer's callbacks (``layerdrop pretrain``
    adds it from the recipe's ``guard`` section), else a default one kept on the module."""
    guard = next((cb for cb in trainer.callbacks if isinstance(cb, NonFiniteLossGuard)), None)
    if guard is None:
        guard = trainer.lightning_module.__dict__.setdefault("_default_nonfinite_guard", NonFiniteLossGuard())
    return guard


def _advice(trainer: pl.Trainer, streak_start: int) -> str:
    """Where to go back to: the newest finite checkpoint whose weights predate the streak."""
    checkpoint = trainer.checkpoint_callback
    newest = getattr(checkpoint, "newest_finite_checkpoint", None)
    path = newest(before_step=streak_start) if newest is not None else None
    if path is None:
        return (f"No checkpoint from before step {streak_start} exists: start again with a lower learning rate "
                "or check the data")
    return (f"The newest checkpoint from before step {streak_start}, checked finite, is {path}: resume from it "
            f"with a lower learning rate (--resume {path} --model.parametrization.lr ...) or check the data")


def _loss_is_bad(loss: torch.Tensor | None, device: torch.device) -> torch.Tensor:
    if loss is None:
        return torch.zeros((), dtype=torch.bool, device=device)
    return ~torch.isfinite(loss.detach()).all().to(device)


def _gradients_are_bad(trainer: pl.Trainer, optimizer: Any) -> torch.Tensor:
    """Whether this rank's gradients (its shards under FSDP2) have a non-finite norm:
    one fused norm over all of them. Left to the scaler when there is one (16-mixed)."""
    device = trainer.strategy.root_device
    local = entry_of(trainer.strategy).local_tensor
    grads = [local(p.grad) for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
    if not grads or getattr(trainer.precision_plugin, "scaler", None) is not None:
        return torch.zeros((), dtype=torch.bool, device=device)
    norms = torch._foreach_norm(grads)
    return ~torch.stack([n.to(device) for n in norms]).isfinite().all()


def _gather_flags(trainer: pl.Trainer, loss_bad: torch.Tensor, grads_bad: torch.Tensor) -> torch.Tensor:
    """(world size, 2) bools: every rank's (loss, gradient) verdict, on every rank: one
    all-gather of 2 float32 per rank (benchmarks/comm_volume.py counts it) and the one
    host synchronisation of the check."""
    local = torch.stack([loss_bad, grads_bad]).float()
    if trainer.world_size == 1:
        return local.reshape(1, 2).bool().cpu()
    import torch.distributed as dist

    gathered = local.new_empty(trainer.world_size * 2)
    dist.all_gather_into_tensor(gathered, local)
    return gathered.reshape(-1, 2).bool().cpu()


def _describe(bad: torch.Tensor) -> str:
    parts = []
    for column, name in ((0, "loss"), (1, "gradient norm")):
        ranks = [str(r) for r in range(bad.shape[0]) if bad[r, column]]
        if ranks:
            where = "" if bad.shape[0] == 1 else f" on rank{'s' if len(ranks) > 1 else ''} {','.join(ranks)}"
            parts.append(f"non-finite {name}{where}")
    return " and ".join(parts)


# ------------------------------------------------------------------ state checks


def refuse_nonfinite_state(trainer: pl.Trainer, what: str, consequence: str) -> None:
    """Raise NonFiniteLossError when any rank's parameters or optimizer state hold a
    NaN/Inf (a collective: every rank must call it)."""
    names = nonfinite_state(trainer)
    count = torch.tensor(float(len(names)), device=trainer.strategy.root_device)
    total = int(trainer.strategy.reduce(count, reduce_op="sum")) if trainer.world_size > 1 else len(names)
    if total:
        shown = ", ".join(names[:3]) if names else "on another rank"
        raise NonFiniteLossError(f"{what} holds {total} non-finite tensor{'s' if total > 1 else ''} "
                                 f"({shown}{', ...' if len(names) > 3 else ''}); {consequence}")


def nonfinite_state(trainer: pl.Trainer) -> list[str]:
    """Names of this rank's parameter and optimizer tensors holding a NaN or Inf."""
    by_device: dict[torch.device, list[tuple[str, torch.Tensor]]] = {}
    for name, tensor in _state_tensors(trainer):
        by_device.setdefault(tensor.device, []).append((name, tensor.isfinite().all()))
    bad = []
    for pairs in by_device.values():  # one synchronisation per device, not one per tensor
        finite = torch.stack([flag for _, flag in pairs]).cpu().tolist()
        bad += [name for (name, _), ok in zip(pairs, finite) if not ok]
    return bad


def _state_tensors(trainer: pl.Trainer) -> Iterator[tuple[str, torch.Tensor]]:
    """This rank's floating-point parameters and optimizer state (its part of each, as
    the strategy's entry says). An optimizer whose parameters are not the module's
    (a ZeRO optimizer forwards ``param_groups``/``state`` to the optimizer of its fp32
    partitions) has them checked as master weights."""
    module = trainer.lightning_module
    local = entry_of(trainer.strategy).local_tensor
    names: dict[int, str] = {}
    for name, param in module.named_parameters():
        names[id(param)] = name
        yield from _floating(name, local(param))
    for index, optimizer in enumerate(trainer.optimizers):
        for group_index, group in enumerate(optimizer.param_groups):
            for position, param in enumerate(group["params"]):
                where = names.get(id(param), f"optimizer {index} group {group.get('name', group_index)} #{position}")
                if id(param) not in names:
                    yield from _floating(f"{where} (master weights)", local(param))
                for key, value in optimizer.state.get(param, {}).items():
                    yield from _floating(f"{where} (optimizer {key})", local(value))


def _floating(name: str, tensor: Any) -> Iterator[tuple[str, torch.Tensor]]:
    if isinstance(tensor, torch.Tensor) and tensor.is_floating_point() and tensor.numel():
        yield name, tensor.detach()


__all__ = ["NonFiniteLossGuard", "NonFiniteLossError", "guard_of", "refuse_nonfinite_state", "nonfinite_state",
           "DEFAULT_MAX_CONSECUTIVE"]

"""Learning-rate schedule: linear warmup, then linear-to-zero or cosine decay.

A pure function of the optimizer step, so a resumed run needs no saved schedule state
beyond the step itself. The factor multiplies every parameter group's own LR (the
parametrization gives groups different base LRs; the schedule shapes them alike).

    warmup  (t < W)       (t + 1) / W                                  (never exactly 0)
    linear  (t >= W)      m + (1 - m) · (1 - progress)                 (m = min_lr_ratio)
    cosine  (t >= W)      m + (1 - m) · (1 + cos(π · progress)) / 2
    constant              1
    progress = (t - W) / (T - W), reaching 1 only after the last step (t = T - 1).

Linear decay to zero is the default: for AdamW it beats cosine at compute-optimal
budgets (Bergsma et al., "Straight to zero", 2025), the regime of the Power Lines
rules the recipes follow.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from framework.config import Fraction, NonNegativeInt, Rate, validate

DECAYS = ("linear", "cosine", "constant")


@dataclass(frozen=True)
class LRScheduleConfig:
    """Warmup length (steps, or a fraction of the run) and the decay shape after it."""

    warmup_steps: NonNegativeInt = 0
    warmup_fraction: Rate = 0.0
    decay: Literal[DECAYS] = "linear"  # type: ignore[valid-type]
    min_lr_ratio: Fraction = 0.0

    def __post_init__(self) -> None:
        validate(self)
        if self.warmup_steps and self.warmup_fraction:
            raise ValueError(f"warmup_steps={self.warmup_steps} and warmup_fraction={self.warmup_fraction} "
                             "are invalid together: set one of them")

    def warmup_for(self, total_steps: int) -> int:
        """Warmup length in steps for a run of ``total_steps``."""
        if self.warmup_fraction:
            return max(1, round(self.warmup_fraction * total_steps))
        return self.warmup_steps


def lr_factor(step: int, *, total_steps: int, warmup_steps: int = 0, decay: str = "linear",
              min_lr_ratio: float = 0.0) -> float:
    """The LR multiplier at optimizer step ``step`` (0-based) of a ``total_steps`` run
    (``schedule_for`` checks the warmup against the run once; this trusts it)."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if decay == "constant":
        return 1.0
    # Steps past the end (a run extended on resume without a new max_steps) hold the
    # final value instead of going negative.
    progress = min(1.0, (step - warmup_steps) / (total_steps - warmup_steps))
    shape = 1.0 - progress if decay == "linear" else 0.5 * (1.0 + math.cos(math.pi * progress))
    return min_lr_ratio + (1.0 - min_lr_ratio) * shape


def schedule_for(cfg: LRScheduleConfig, total_steps: int):
    """``step -> factor`` for ``torch.optim.lr_scheduler.LambdaLR``.

    A plain function on purpose: LambdaLR saves the ``__dict__`` of callable objects
    into its state_dict, which would pin the old run length on resume.
    """
    warmup = cfg.warmup_for(total_steps)
    if warmup >= total_steps:  # the one check that needs the run length
        raise ValueError(f"warmup_steps={warmup} is invalid: must be < the run's {total_steps} steps")

    def factor(step: int) -> float:
        return lr_factor(step, total_steps=total_steps, warmup_steps=warmup, decay=cfg.decay,
                         min_lr_ratio=cfg.min_lr_ratio)

    return factor


__all__ = ["LRScheduleConfig", "lr_factor", "schedule_for", "DECAYS"]

"""Layer-dropout rates over depth and time (paper §6–§7, glossary).

The rate of layer ℓ at optimizer step t factorises into a depth part and a time part,

    p_{ℓ,t} = p_dist(ℓ) · f(t),

with the depth distributions (ℓ = 0..L-1)

    uniform      p_max
    increasing   ℓ/(L-1) · p_max            (ILD: the first layer is never dropped)
    alternating  p_max if ℓ is odd else 0   (ALD)
    (p_0, …)     an explicit per-layer list

and the time schedules (t = 0..T-1)

    constant     1
    increasing   t/(T-1)                     (ITS)
    decreasing   1 - t/(T-1)                 (DTS: dense at the last step)

The paper's glossary writes t/T; we use t/(T-1) so that ITS reaches p_max and DTS
reaches exactly 0 on the last optimizer step. Degenerate sizes agree with the
neighbouring general case: ILD over L = 1 layer is [0.0] (the only layer is the first
one, which ILD keeps); with T = 1, ITS gives 0 and DTS gives 1, their values at t = 0.

Each registry below is the one place its names live: the configs' field types are
built from them. Adding a distribution or a schedule is a function and an entry here
(and its test); P̄ (``mean_dropout``) is summed from the definition, so no closed form
has to be derived for it.

Everything here trusts its arguments: the configs are validated when they are built,
and the training loop passes steps inside the run.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Callable, Sequence

if TYPE_CHECKING:
    from framework.config import LayerDropoutConfig


# ----------------------------------------------------------- depth distributions


def uniform(p_max: float, num_layers: int) -> list[float]:
    return [p_max] * num_layers


def increasing_over_depth(p_max: float, num_layers: int) -> list[float]:
    if num_layers == 1:
        return [0.0]
    return [layer / (num_layers - 1) * p_max for layer in range(num_layers)]


def alternating(p_max: float, num_layers: int) -> list[float]:
    return [p_max if layer % 2 == 1 else 0.0 for layer in range(num_layers)]


# name -> (p_max, L) -> [p_dist(ℓ) for ℓ = 0..L-1]
DISTRIBUTIONS: dict[str, Callable[[float, int], list[float]]] = {
    "uniform": uniform,
    "increasing": increasing_over_depth,
    "alternating": alternating,
}


# -------------------------------------------------------------- time schedules


def constant(step: int, total_steps: int) -> float:
    return 1.0


def increasing_over_time(step: int, total_steps: int) -> float:
    return step / (total_steps - 1) if total_steps > 1 else 0.0


def decreasing_over_time(step: int, total_steps: int) -> float:
    return 1.0 - increasing_over_time(step, total_steps)


# name -> (t, T) -> f(t) in [0, 1]
TIME_SCHEDULES: dict[str, Callable[[int, int], float]] = {
    "constant": constant,
    "increasing": increasing_over_time,
    "decreasing": decreasing_over_time,
}


# ---------------------------------------------------------------------- rates


def layer_distribution(cfg: LayerDropoutConfig, num_layers: int) -> list[float]:
    """p_dist(ℓ) for ℓ = 0..num_layers-1 (the rate at full strength of the schedule)."""
    if isinstance(cfg.distribution, tuple):
        return list(cfg.distribution)
    return DISTRIBUTIONS[cfg.distribution](cfg.p_max, num_layers)


def time_factor(schedule: str, step: int, total_steps: int) -> float:
    """f(t) in [0, 1] that multiplies every layer's rate at optimizer step ``step``."""
    return TIME_SCHEDULES[schedule](step, total_steps)


def mean_time_factor(schedule: str, total_steps: int) -> float:
    """The average of f(t) over t = 0..T-1, summed exactly (``math.fsum``) from the
    schedule's own definition: O(T), ~0.1 s for the 385k steps of the 8.2B recipe."""
    factor = TIME_SCHEDULES[schedule]
    return math.fsum(factor(step, total_steps) for step in range(total_steps)) / total_steps


def dropout_rates(cfg: LayerDropoutConfig, num_layers: int, step: int,
                  total_steps: int) -> list[float]:
    """p_{ℓ,t} for every layer at optimizer step ``step`` of a ``total_steps`` run."""
    factor = time_factor(cfg.schedule, step, total_steps)
    return [p * factor for p in layer_distribution(cfg, num_layers)]


def mean_dropout(cfg: LayerDropoutConfig, num_layers: int, total_steps: int) -> float:
    """P̄: the average of p_{ℓ,t} over all layers and steps — the fraction of the blocks'
    training FLOPs that layer dropout saves in expectation.

    O(L + T): p_{ℓ,t} = p_dist(ℓ)·f(t), so the average over (ℓ, t) is the product of
    the average over layers and the average over steps, each an exact sum.
    """
    distribution = layer_distribution(cfg, num_layers)
    return math.fsum(distribution) / num_layers * mean_time_factor(cfg.schedule, total_steps)


def effective_depth(cfg: LayerDropoutConfig, num_layers: int, step: int,
                    total_steps: int) -> float:
    """Expected number of blocks a sequence passes through at step t: Σ_ℓ (1 - p_{ℓ,t})."""
    return effective_depth_of(dropout_rates(cfg, num_layers, step, total_steps))


def effective_depth_of(rates: Sequence[float]) -> float:
    """Σ_ℓ (1 - p_ℓ) for explicit per-layer rates."""
    return math.fsum(1.0 - p for p in rates)


__all__ = [
    "DISTRIBUTIONS",
    "TIME_SCHEDULES",
    "layer_distribution",
    "time_factor",
    "mean_time_factor",
    "dropout_rates",
    "mean_dropout",
    "effective_depth",
    "effective_depth_of",
]

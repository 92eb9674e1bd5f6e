"""Layer-dropout rates over depth and time (paper §6–§7, glossary).

The rate of layer ℓ at optimizer step t factorises into a depth part and a time part,

    p_{ℓ,t} = p_dist(ℓ) · f(t),

with the depth distributions (ℓ = 0..L-1)

    uniform      p_max
    increasing   ℓ/(L-1) · p_max            (ILD: the first layer is never dropped)
    alternating  p_max if ℓ is odd else 0   (ALD)
    [p_0, …]     an explicit per-layer list

and the time schedules (t = 0..T-1)

    constant     1
    increasing   t/(T-1)                     (ITS)
    decreasing   1 - t/(T-1)                 (DTS: dense at the last step)

The paper's glossary writes t/T; we use t/(T-1) so that ITS reaches p_max and DTS
reaches exactly 0 on the last optimizer step, and so that f averages exactly 1/2 over
a run, which makes the closed forms of P̄ (ILD+DTS = p_max/4, …) exact.

Degenerate sizes, chosen to agree with the neighbouring general case:
- L = 1 with ILD gives [0.0]: the single layer is the first layer, which ILD keeps.
- T = 1: ITS gives f = 0 and DTS gives f = 1, their values at t = 0 for any T.
"""

from __future__ import annotations

import math
from typing import Sequence

from framework.config import DISTRIBUTIONS, SCHEDULES, LayerDropoutConfig


def _check_count(name: str, value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{name}={value!r} is invalid: must be a positive integer")
    return value


def _check_step(step: object, total_steps: int) -> int:
    if not isinstance(step, int) or isinstance(step, bool) or not 0 <= step < total_steps:
        raise ValueError(f"step={step!r} is invalid: must be an integer in "
                         f"[0, {total_steps - 1}] (total_steps={total_steps})")
    return step


def _check_p_max(cfg: LayerDropoutConfig) -> float:
    # The config validates on construction; re-check because dataclasses stay mutable.
    p_max = cfg.p_max
    if isinstance(p_max, bool) or not isinstance(p_max, (int, float)) or not 0.0 <= p_max < 1.0:
        raise ValueError(f"p_max={p_max!r} is invalid: must be in [0, 1)")
    return float(p_max)


def layer_distribution(cfg: LayerDropoutConfig, num_layers: int) -> list[float]:
    """p_dist(ℓ) for ℓ = 0..num_layers-1 (the rate at full strength of the schedule)."""
    num_layers = _check_count("num_layers", num_layers)
    distribution = cfg.distribution
    if isinstance(distribution, (list, tuple)):
        cfg.check_layers(num_layers)
        rates = [float(p) for p in distribution]
        for p in rates:
            if not 0.0 <= p < 1.0:
                raise ValueError(f"distribution={rates!r} is invalid: every explicit "
                                 "per-layer rate must be in [0, 1)")
        return rates
    p_max = _check_p_max(cfg)
    if distribution == "uniform":
        return [p_max] * num_layers
    if distribution == "increasing":
        if num_layers == 1:
            return [0.0]
        return [layer / (num_layers - 1) * p_max for layer in range(num_layers)]
    if distribution == "alternating":
        return [p_max if layer % 2 == 1 else 0.0 for layer in range(num_layers)]
    raise ValueError(f"distribution={distribution!r} is invalid: allowed: "
                     f"{', '.join(DISTRIBUTIONS)}, or an explicit list of per-layer rates")


def time_factor(schedule: str, step: int, total_steps: int) -> float:
    """f(t) in [0, 1] that multiplies every layer's rate at optimizer step ``step``."""
    total_steps = _check_count("total_steps", total_steps)
    step = _check_step(step, total_steps)
    if schedule == "constant":
        return 1.0
    if schedule in ("increasing", "decreasing"):
        progress = step / (total_steps - 1) if total_steps > 1 else 0.0
        return progress if schedule == "increasing" else 1.0 - progress
    raise ValueError(f"schedule={schedule!r} is invalid: allowed: {', '.join(SCHEDULES)}")


def mean_time_factor(schedule: str, total_steps: int) -> float:
    """The exact average of f(t) over t = 0..T-1, in closed form (Σ t = T(T-1)/2)."""
    total_steps = _check_count("total_steps", total_steps)
    if schedule == "constant":
        return 1.0
    if schedule in ("increasing", "decreasing"):
        if total_steps == 1:
            return time_factor(schedule, 0, 1)
        return 0.5
    raise ValueError(f"schedule={schedule!r} is invalid: allowed: {', '.join(SCHEDULES)}")


def dropout_rates(cfg: LayerDropoutConfig, num_layers: int, step: int,
                  total_steps: int) -> list[float]:
    """p_{ℓ,t} for every layer at optimizer step ``step`` of a ``total_steps`` run."""
    factor = time_factor(cfg.schedule, step, total_steps)
    return [p * factor for p in layer_distribution(cfg, num_layers)]


def mean_dropout(cfg: LayerDropoutConfig, num_layers: int, total_steps: int) -> float:
    """P̄: the average of p_{ℓ,t} over all layers and steps — the fraction of the blocks'
    training FLOPs that layer dropout saves in expectation.

    Exact and O(L): because p_{ℓ,t} = p_dist(ℓ)·f(t), the double average is the product
    of the two averages, so a run of 10^9 steps costs no more than one of 10.
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
    "layer_distribution",
    "time_factor",
    "mean_time_factor",
    "dropout_rates",
    "mean_dropout",
    "effective_depth",
    "effective_depth_of",
]

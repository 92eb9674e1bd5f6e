"""LayerSkip's early-exit loss: which exits a training step adds a loss at, and how much.

Layer dropout makes the lower layers usable as early exits; the early-exit loss
(LayerSkip, Elhoushi et al. 2024) trains them to predict. A training step's objective is

    CE_L + scale · Σ_{K ∈ A_t} w_K · CE_K,        w_K = s(K) / Σ_{J ∈ A_t} s(J)

with CE_K the cross-entropy of exit K (blocks 0..K-1, then the shared final norm and
head; K = L is the full model), A_t the exits the curriculum switches on at optimizer
step t, and s a scale function of the exit. ``scale`` is the exit losses' total weight
beside the final layer's (LayerSkip's e_scale); 0 turns the early-exit loss off.

The scale functions (K = 1..L-1):

    uniform   1
    linear    K               deeper exits weigh more
    sum       K(K+1)/2        LayerSkip's Σ_i i, counted from 1 so that exit 1 is not weightless
    sqrt      √K
    inverse   1/K             shallower exits weigh more

and the curricula, over the configured exits E_1 < … < E_n:

    none        every configured exit, every step
    rotational  the exits whose position i (0-based) has i ≡ t (mod rotation): a
                rotating subset of about n/rotation exits a step, each exit every
                ``rotation`` steps
    gradual     switched on from the top down: the deepest exit from step 0, then one
                more every ramp·T/n steps, all n from step ⌈(n-1)·ramp·T/n⌉ on

Everything is a pure function of (config, L, t, T), like framework/schedules.py: every
rank computes the same exits (no rank skips a head call another makes) and a resumed
run needs no curriculum state. The registries are the one place their names live; the
config's field types are built from them.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from framework.config import EarlyExitLossConfig


# ------------------------------------------------------------------ scale functions

# name -> exit K (1..L-1) -> its unnormalised weight s(K) > 0
SCALE_FUNCTIONS: dict[str, Callable[[int], float]] = {
    "uniform": lambda exit: 1.0,
    "linear": lambda exit: float(exit),
    "sum": lambda exit: exit * (exit + 1) / 2,
    "sqrt": lambda exit: math.sqrt(exit),
    "inverse": lambda exit: 1.0 / exit,
}


# ------------------------------------------------------------------------ curricula


def every_exit(exits: list[int], step: int, total_steps: int, cfg: EarlyExitLossConfig) -> list[int]:
    return exits


def rotational(exits: list[int], step: int, total_steps: int, cfg: EarlyExitLossConfig) -> list[int]:
    return [exit for position, exit in enumerate(exits) if position % cfg.rotation == step % cfg.rotation]


def gradual(exits: list[int], step: int, total_steps: int, cfg: EarlyExitLossConfig) -> list[int]:
    switched_on = min(len(exits), math.floor(step * len(exits) / (cfg.ramp * total_steps)) + 1)
    return exits[len(exits) - switched_on:]


# name -> (configured exits, t, T, config) -> the exits with a loss at step t
CURRICULA: dict[str, Callable[[list[int], int, int, "EarlyExitLossConfig"], list[int]]] = {
    "none": every_exit,
    "rotational": rotational,
    "gradual": gradual,
}


# ---------------------------------------------------------------------------- exits


def configured_exits(cfg: EarlyExitLossConfig, num_layers: int) -> list[int]:
    """The exits the loss may use, in 1..L-1, ascending: every ``every``-th, or the list."""
    if cfg.scale == 0:
        return []
    if isinstance(cfg.exits, tuple):
        return sorted(cfg.exits)
    return list(range(cfg.every, num_layers, cfg.every))


def check_exits(cfg: EarlyExitLossConfig, num_layers: int) -> None:
    """Refuse exits the model does not have (the config alone does not know L)."""
    if cfg.scale == 0:
        return
    outside = [exit for exit in configured_exits(cfg, num_layers) if exit >= num_layers]
    if outside:
        raise ValueError(f"early_exit_loss.exits={list(cfg.exits)!r} is invalid: exits must be in "
                         f"1..{num_layers - 1} (exit K runs blocks 0..K-1; exit {num_layers} is the final layer)")
    exits = configured_exits(cfg, num_layers)
    if not exits:
        raise ValueError(f"early_exit_loss.every={cfg.every!r} is invalid: the model's {num_layers} layers "
                         f"have no exit below {num_layers} that is a multiple of it")
    if cfg.curriculum == "rotational" and cfg.rotation > len(exits):
        raise ValueError(f"early_exit_loss.rotation={cfg.rotation!r} is invalid: must be at most the number of "
                         f"exits ({len(exits)}: {exits}), or some steps would train no exit")


def active_exits(cfg: EarlyExitLossConfig, num_layers: int, step: int, total_steps: int) -> list[int]:
    """A_t: the exits that get a loss at optimizer step ``step`` of a ``total_steps`` run."""
    exits = configured_exits(cfg, num_layers)
    return CURRICULA[cfg.curriculum](exits, step, total_steps, cfg) if exits else []


def exit_weights(cfg: EarlyExitLossConfig, num_layers: int, step: int, total_steps: int) -> dict[int, float]:
    """{K: scale · w_K} for the exits of step ``step``; empty when the loss is off."""
    active = active_exits(cfg, num_layers, step, total_steps)
    scales = {exit: SCALE_FUNCTIONS[cfg.weighting](exit) for exit in active}
    norm = math.fsum(scales.values())
    return {exit: cfg.scale * s / norm for exit, s in scales.items()}


def mean_exit_heads(cfg: EarlyExitLossConfig, num_layers: int, total_steps: int) -> float:
    """Exit heads a step runs, averaged over the run (summed exactly: O(T)); each one
    costs a head forward and backward on every token (framework/flops.py)."""
    exits = configured_exits(cfg, num_layers)
    if cfg.curriculum == "none" or not exits:
        return float(len(exits))
    return math.fsum(len(active_exits(cfg, num_layers, step, total_steps))
                     for step in range(total_steps)) / total_steps


__all__ = [
    "SCALE_FUNCTIONS",
    "CURRICULA",
    "configured_exits",
    "check_exits",
    "active_exits",
    "exit_weights",
    "mean_exit_heads",
]

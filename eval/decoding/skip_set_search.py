"""The four searches of the draft's skip set the paper compares (§8.2.2): Bayesian
optimisation (as Zhang et al.), a genetic algorithm, hill climbing and simulated
annealing. Each gets the same budget of objective evaluations (distinct skip sets; a
revisit is free) and any objective of a mask, here eval/decoding/draft_objective.py's
estimated speedup (`layerdrop speculate search`: eval/decoding/draft_search.py).
"""

from __future__ import annotations

import math
import random
from typing import Callable, Sequence

Mask = tuple[bool, ...]  # mask[i] is True when the draft skips layer i


class BudgetExhausted(Exception):
    pass


def skip_set(mask: Mask) -> tuple[int, ...]:
    return tuple(i for i, skipped in enumerate(mask) if skipped)


class BudgetedObjective:
    """Counts distinct evaluations, refuses the one past the budget, keeps the history."""

    def __init__(self, fn: Callable[[Mask], float], budget: int, memo: dict | None = None,
                 on_step: Callable[[], None] | None = None) -> None:
        if not (isinstance(budget, int) and budget >= 1):
            raise ValueError(f"budget={budget!r} is invalid: must be an integer >= 1")
        self.fn, self.budget, self.on_step = fn, budget, on_step
        self.memo = {} if memo is None else memo  # may be shared: values, not the count
        self.seen: dict[Mask, float] = {}
        self.best_so_far: list[float] = []
        self.best: tuple[float, Mask] | None = None

    def __call__(self, mask: Mask) -> float:
        mask = tuple(bool(b) for b in mask)
        if mask in self.seen:
            return self.seen[mask]
        if len(self.seen) >= self.budget:
            raise BudgetExhausted
        if mask not in self.memo:
            self.memo[mask] = self.fn(mask)
        value = self.seen[mask] = self.memo[mask]
        if self.on_step is not None:
            self.on_step()
        if self.best is None or value > self.best[0]:
            self.best = (value, mask)
        self.best_so_far.append(self.best[0])
        return value

    @property
    def remaining(self) -> int:
        return self.budget - len(self.seen)


# ---------------------------------------------------------------------- methods
# Each runs until the budget is spent; a cap on proposals stops a method that only
# revisits sets it has seen (which cost nothing) from spinning forever.


def bayesian(objective: BudgetedObjective, num_layers: int, rng: random.Random) -> None:
    """Optuna's TPE sampler over one skip/keep choice per layer (ask/tell loop)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    sampler = optuna.samplers.TPESampler(seed=rng.randrange(2**31), multivariate=True,
                                         n_startup_trials=max(2, min(10, objective.budget // 4)))
    study = optuna.create_study(direction="maximize", sampler=sampler)
    for _ in range(20 * objective.budget):
        if objective.remaining == 0:
            return
        trial = study.ask()
        mask = tuple(trial.suggest_categorical(f"skip_{i}", [False, True]) for i in range(num_layers))
        study.tell(trial, objective(mask))


def genetic(objective: BudgetedObjective, num_layers: int, rng: random.Random, *, population: int = 12,
            elite: int = 2, tournament: int = 3) -> None:
    """Elitist GA: tournament selection, uniform crossover, bit-flip mutation (1/L)."""
    size = max(4, min(population, objective.budget // 3))
    pop = [tuple(rng.random() < 0.5 for _ in range(num_layers)) for _ in range(size)]
    for _ in range(20 * objective.budget):
        scored = sorted(((objective(m), m) for m in pop), reverse=True)
        children = [m for _, m in scored[:elite]]
        while len(children) < size:
            a = max(rng.sample(scored, min(tournament, len(scored))))[1]
            b = max(rng.sample(scored, min(tournament, len(scored))))[1]
            child = tuple((x if rng.random() < 0.5 else y) != (rng.random() < 1.0 / num_layers)
                          for x, y in zip(a, b))
            children.append(child)
        pop = children


def _neighbours(mask: Mask, rng: random.Random) -> list[Mask]:
    out = [mask[:i] + (not mask[i],) + mask[i + 1:] for i in range(len(mask))]
    rng.shuffle(out)
    return out


def hill_climbing(objective: BudgetedObjective, num_layers: int, rng: random.Random) -> None:
    """First-improvement over single-layer flips from the full model (nothing skipped);
    a random restart at every local optimum."""
    current: Mask = (False,) * num_layers
    for _ in range(20 * objective.budget):
        value = objective(current)
        better = next((n for n in _neighbours(current, rng) if objective(n) > value), None)
        current = better or tuple(rng.random() < 0.5 for _ in range(num_layers))


def simulated_annealing(objective: BudgetedObjective, num_layers: int, rng: random.Random, *,
                        start_temperature: float = 0.1, end_temperature: float = 0.002) -> None:
    """Flip one random layer; accept worse sets with probability exp(Δ/T), T cooling
    geometrically over the budget (temperatures in speedup units)."""
    current: Mask = (False,) * num_layers
    value = objective(current)
    for _ in range(20 * objective.budget):
        progress = 1.0 - objective.remaining / objective.budget
        temperature = start_temperature * (end_temperature / start_temperature) ** progress
        i = rng.randrange(num_layers)
        candidate = current[:i] + (not current[i],) + current[i + 1:]
        new = objective(candidate)
        if new >= value or rng.random() < math.exp((new - value) / temperature):
            current, value = candidate, new


# The registry: a method's name -> its implementation, in the order reports list them.
SEARCHES: dict[str, Callable[[BudgetedObjective, int, random.Random], None]] = {
    "bayesian": bayesian, "genetic": genetic, "hill_climbing": hill_climbing,
    "simulated_annealing": simulated_annealing,
}
METHODS = tuple(SEARCHES)


def run_search(fn: Callable[[Mask], float], num_layers: int, *, methods: Sequence[str] | None = None,
               budget: int = 60, seed: int = 0, on_step: Callable[[], None] | None = None) -> dict[str, dict]:
    """Every method on ``fn`` with ``budget`` evaluations each; values are shared
    between methods (the objective is deterministic), the counts are not."""
    methods = METHODS if methods is None else methods
    unknown = [m for m in methods if m not in SEARCHES]
    if unknown or not methods:
        raise ValueError(f"methods={list(methods)} is invalid: allowed: {', '.join(METHODS)}")
    memo: dict[Mask, float] = {}
    results = {}
    for name in methods:
        objective = BudgetedObjective(fn, budget, memo, on_step)
        try:
            SEARCHES[name](objective, num_layers, random.Random(f"{seed}:{name}"))
        except BudgetExhausted:
            pass
        value, mask = objective.best
        results[name] = {"skip_layers": list(skip_set(mask)), "value": value,
                         "evaluations": len(objective.seen), "best_so_far": objective.best_so_far}
    top = max(r["value"] for r in results.values())
    for r in results.values():
        r["evaluations_to_within_5pct"] = next(
            (i + 1 for i, v in enumerate(r["best_so_far"]) if v >= 0.95 * top), None)
    return results


__all__ = ["Mask", "BudgetExhausted", "BudgetedObjective", "skip_set", "SEARCHES", "METHODS", "run_search"]

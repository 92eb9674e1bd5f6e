"""Compute-matched baselines: a configuration trained to the executed FLOPs of others.

Comparing a layer-dropout run's final loss with the dense run's curve part-way through
mixes two effects: layer dropout, and the learning-rate anneal the dense run has not had
yet (at 1,000 CPU steps the anneal alone is worth ~0.3 nats). The fair baseline at equal
FLOPs is a dense run *as long as the dropout run's FLOPs allow, with its own full
schedule*. A sweep file asks for such runs with a block:

    flops_matched:
      baseline: dense                       # the configuration trained to the others' FLOPs
      to: [ild-dts-0.4, ild-dts-0.8]        # whose predicted training FLOPs set the budgets;
                                            # "*": every configuration with layer dropout (P̄ > 0)
      seeds: [0, 1]                         # optional; default: the baseline's seeds
      count: non_embedding                  # optional: which FLOPs are equal (below)

``count`` names the convention the budgets are equal in (summary.json records both, named so):
``non_embedding`` (the default) counts the blocks' FLOPs, the paper's "FLOPs" (its footnote 11,
summary.json's ``non_embedding_training_flops``): P̄ saves exactly that share, so ILD+DTS p_max
0.8 (P̄ 20%) gets a dense run of 80% of its steps. ``total`` counts every FLOP a training step
runs, the unembedding and early-exit heads too, which layer dropout does not save
(``total_training_flops``): the dense run is longer (82% of the steps for the CPU model, whose
unembedding is a tenth of its compute) and the test stricter. ``executed`` is the older name of
``total`` (the sweep files of docs/reproduction and docs/reproduction-6tpp use it).

Each budget becomes a configuration named ``<baseline>-steps=<N>`` (runs
``dense-steps=900,seed=0``, …): the baseline's overrides with

- ``trainer.max_steps`` = N, the step count whose predicted FLOPs are nearest the
  target's (round(baseline steps × target FLOPs / baseline FLOPs), then checked: the two
  differ by less than one step's FLOPs; eval/experiments/sweep/spec.py's ``predict``, as
  `layerdrop sweep --dry-run` shows). Targets that need the same N share the run
  (ILD 0.4, ALD 0.4 and ILD+DTS 0.8 all save 20%); a target that needs the baseline's
  own length needs no run;
- its own full schedule, because everything run-length dependent is derived from
  ``trainer.max_steps``: linear decay to zero over its N steps, a ``warmup_fraction`` of
  N (an absolute ``warmup_steps`` stays what the recipe says), and the weight decay
  λ = 1/(η·τ_EMA·N) (framework/training/module.py);
- ``trainer.val_check_interval`` moved to the divisor of its training batches nearest the
  baseline's interval (so its last step is validated and its curve ends where it ends),
  and ``checkpoint.every_n_steps`` at most N.

Names end in ``-steps=N``, not ``,steps=N``, so an evaluation's ``only: ["dense,*"]`` does
not pick them up (``only: ["dense-steps=*"]`` does). `layerdrop report` finds such runs by
what they are, not by name (eval/experiments/sweep/results.py: ``mark_compute_matched``).

This module is pure: eval/experiments/sweep/spec.py passes in how to build a recipe and
predict its FLOPs.
"""

from __future__ import annotations

import math
from typing import Any, Callable

from eval.experiments.sweep.dotted_keys import get_dotted

BLOCK_KEYS = ("baseline", "to", "seeds", "count")
COUNTS = {"non_embedding": "non_embedding_flops", "total": "training_flops",
          "executed": "training_flops"}  # -> the Prediction's field; "executed": the older name of "total"
COUNT_NAMES = {"non_embedding": "non-embedding FLOPs (the blocks)",
               "total": "total FLOPs (blocks, unembedding, early-exit heads)",
               "executed": "total FLOPs (blocks, unembedding, early-exit heads)"}
MAX_STEPS, VAL_INTERVAL = "trainer.max_steps", "trainer.val_check_interval"
CHECKPOINT_EVERY = "checkpoint.every_n_steps"
ACCUMULATE = "trainer.accumulate_grad_batches"

Config = tuple[str, dict[str, Any], "list[int] | None"]


def matched_configs(block: Any, configs: list[Config], default_seeds: list[int],
                    recipe_of: Callable[[dict[str, Any]], dict],
                    predict: Callable[[dict], Any]) -> list[tuple[str, dict[str, Any], list[int], tuple[str, ...]]]:
    """The configurations a ``flops_matched`` block asks for: (name, overrides, seeds,
    the target configurations it matches). ``recipe_of(overrides)`` is the resolved recipe
    of a configuration (seeds aside), ``predict(recipe)`` its spec.Prediction.
    Raises ValueError with one line."""
    if not isinstance(block, dict):
        raise ValueError(f"flops_matched={block!r} is invalid: expected a mapping with keys {', '.join(BLOCK_KEYS)}")
    unknown = sorted(set(block) - set(BLOCK_KEYS))
    if unknown:
        raise ValueError(f"flops_matched keys {unknown} are invalid: allowed: {', '.join(BLOCK_KEYS)}")
    count = block.get("count", "non_embedding")
    if count not in COUNTS:
        raise ValueError(f"flops_matched.count={count!r} is invalid: expected one of {', '.join(COUNTS)}")

    def flops_of(recipe: dict) -> float:
        return getattr(predict(recipe), COUNTS[count])

    by_name = {name: (overrides, seeds) for name, overrides, seeds in configs}
    baseline = block.get("baseline")
    if baseline not in by_name:
        raise ValueError(f"flops_matched.baseline={baseline!r} is invalid: expected one of the configurations: "
                         f"{', '.join(by_name)}")
    base_overrides, base_seeds = by_name[baseline]
    seeds = _seeds(block.get("seeds"), base_seeds or default_seeds)
    base_recipe = recipe_of(base_overrides)
    base_steps = int(get_dotted(base_recipe, MAX_STEPS) or 0)
    base_flops = flops_of(base_recipe)
    targets = _targets(block.get("to"), by_name, baseline, recipe_of, lambda r: predict(r).mean_dropout)
    by_steps: dict[int, list[str]] = {}
    for target in targets:
        target_flops = flops_of(recipe_of(by_name[target][0]))
        steps = matched_steps(base_steps, base_flops, target_flops,
                              lambda n: flops_of(recipe_of({**base_overrides, MAX_STEPS: n})))
        if steps != base_steps:
            by_steps.setdefault(steps, []).append(target)
    found = []
    for steps, matched in sorted(by_steps.items()):
        overrides = {**base_overrides, MAX_STEPS: steps, **length_settings(base_recipe, steps)}
        found.append((f"{baseline}-steps={steps}", overrides, seeds, tuple(matched)))
    return found


def _targets(value: Any, by_name: dict, baseline: str, recipe_of: Callable, dropout_of: Callable) -> list[str]:
    if value == "*" or value == ["*"]:
        return [name for name, (overrides, _) in by_name.items()
                if name != baseline and dropout_of(recipe_of(overrides)) > 0]
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise ValueError(f"flops_matched.to={value!r} is invalid: expected a list of configuration names, or \"*\" "
                         "(every configuration with layer dropout)")
    for name in value:
        if name not in by_name or name == baseline:
            allowed = ", ".join(n for n in by_name if n != baseline)
            raise ValueError(f"flops_matched.to has {name!r}, which is not a configuration of this sweep "
                             f"besides the baseline: expected one of {allowed}, or \"*\"")
    return list(dict.fromkeys(value))


def _seeds(value: Any, default: list[int]) -> list[int]:
    if value is None:
        return list(default)
    if not isinstance(value, list) or not value or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0
                                                           for s in value) or len(set(value)) != len(value):
        raise ValueError(f"flops_matched.seeds={value!r} is invalid: expected a list of distinct integers >= 0")
    return list(value)


def matched_steps(base_steps: int, base_flops: float, target_flops: float, flops_at: Callable[[int], float]) -> int:
    """The baseline's step count whose predicted FLOPs are nearest ``target_flops``
    (proportional first; the neighbours are checked, since early-exit heads or a
    schedule may make the FLOPs per step depend on the length)."""
    if base_steps < 1 or base_flops <= 0:
        raise ValueError("flops_matched.baseline has no trainer.max_steps: its length sets the budgets' steps")
    guess = max(1, round(base_steps * target_flops / base_flops))
    return min(range(max(1, guess - 2), guess + 3), key=lambda n: (abs(flops_at(n) - target_flops), n))


def length_settings(recipe: dict, steps: int) -> dict[str, Any]:
    """The validation interval and checkpoint period of a ``steps``-long run of ``recipe``,
    where they differ from the recipe's: validation on the last step, checkpoints at
    most ``steps`` apart."""
    changed: dict[str, Any] = {}
    interval = get_dotted(recipe, VAL_INTERVAL)
    if isinstance(interval, int) and not isinstance(interval, bool) and interval > 0:
        # Lightning counts the interval in training batches (micro-batches), not optimizer steps.
        batches = steps * int(get_dotted(recipe, ACCUMULATE) or 1)
        moved = validation_interval(interval, batches)
        if moved != interval:
            changed[VAL_INTERVAL] = moved
    every = get_dotted(recipe, CHECKPOINT_EVERY)
    if isinstance(every, int) and every > steps:
        changed[CHECKPOINT_EVERY] = steps
    return changed


def validation_interval(interval: int, batches: int) -> int:
    """The divisor of ``batches`` nearest ``interval`` on a log scale (a validation at
    every multiple of it then includes the last batch). 800 batches at 250: 200; 900:
    225; a prime count: the run's length (validation at its end only)."""
    divisors = [d for d in range(1, batches + 1) if batches % d == 0]
    return min(divisors, key=lambda d: (abs(math.log(d / interval)), -d))


__all__ = ["matched_configs", "matched_steps", "length_settings", "validation_interval", "BLOCK_KEYS", "COUNTS",
           "COUNT_NAMES"]

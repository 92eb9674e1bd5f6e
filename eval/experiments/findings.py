"""The paper's findings and claims, each tested on a sweep's configurations.

Configurations are matched by what they are (their layer-dropout settings and P̄), never
by run names, so any sweep that contains the right pairs gets a verdict:

- **reproduced**: every comparison the claim makes goes the paper's way by more than
  2 standard errors (report_tables: seed noise and evaluation noise combined; without a
  seed-noise estimate a comparison is undecided);
- **not reproduced**: at least one goes the other way by more than 2 standard errors;
- **within noise**: otherwise (no comparison is decided against the paper, not all for it);
- **not tested**: the sweep holds no configurations the claim can be checked on.
"""

from __future__ import annotations

import json
import math
import random
import statistics
from typing import Callable

from eval.experiments.report_tables import (Comparison, Configuration, baseline, compare, evaluation_noise, pooled_std,
                                            spearman, val_loss)
from eval.experiments.sweep_results import LAYER_DROPOUT_DEFAULTS, RunResult

Metric = Callable[[RunResult], float | None]
# The recommended structure, mask and r_train (LayerDropoutConfig's defaults).
RECOMMENDED = {key: LAYER_DROPOUT_DEFAULTS[key] for key in ("structure", "mask", "r_train")}


def dropout(configuration: Configuration) -> dict:
    return {**RECOMMENDED, **{k: v for k, v in configuration.first.layer_dropout.items() if k != "seed"}}


def p_bar(configuration: Configuration) -> float:
    return float(configuration.first.summary["mean_dropout_predicted"])


def exit_loss_scale(configuration: Configuration) -> float:
    """LayerSkip's early-exit loss scale the configuration trained with (0: off)."""
    return float(json.loads(configuration.key).get("model.early_exit_loss.scale") or 0.0)


def twins(configurations: list[Configuration], key: str, a: object, b: object) -> list[tuple[Configuration, Configuration]]:
    """Pairs (x, y) of configurations equal in every layer-dropout setting but ``key``,
    where x has ``key = a`` and y has ``key = b`` (and equal in everything else)."""
    pairs = []
    for x in configurations:
        for y in configurations:
            dx, dy = dropout(x), dropout(y)
            if dx.get(key) == a and dy.get(key) == b and \
                    {k: v for k, v in dx.items() if k != key} == {k: v for k, v in dy.items() if k != key} \
                    and _same_outside_dropout(x, y):
                pairs.append((x, y))
    return pairs


def _same_outside_dropout(x: Configuration, y: Configuration) -> bool:
    return _strip(x, "model.layer_dropout.") == _strip(y, "model.layer_dropout.")


def judge(a: Configuration, b: Configuration, metric: Metric, configurations: list[Configuration], *,
          higher_is_better: bool = False, with_eval_noise: bool = True) -> Comparison | None:
    """a against b on ``metric`` (lower is better unless ``higher_is_better``), with the
    metric's pooled seed noise over every multi-seed configuration."""
    a_values, b_values = a.values(metric), b.values(metric)
    if not a_values or not b_values:
        return None
    sigma, _ = pooled_std([c.values(metric) for c in configurations])
    eval_se = evaluation_noise(a, b) if with_eval_noise and metric is val_loss else None
    if higher_is_better:
        result = compare([-v for v in a_values], [-v for v in b_values], sigma, eval_se, a.label, b.label)
        result.diff = -result.diff  # a − b again; the percentage of b is already the right way round
        return result
    return compare(a_values, b_values, sigma, eval_se, a.label, b.label)


def verdict(comparisons: list[Comparison], expected: str = "better") -> str:
    """Each comparison reads 'a is <expected> than b' in the paper."""
    decided = [c for c in comparisons if c is not None and c.verdict in ("better", "worse")]
    if not [c for c in comparisons if c is not None]:
        return "not tested"
    opposite = "worse" if expected == "better" else "better"
    if any(c.verdict == opposite for c in decided):
        return "not reproduced"
    if len(decided) == len(comparisons) and all(c.verdict == expected for c in decided):
        return "reproduced"
    return "within noise"


def finding(identifier: str, claim: str, test: str, comparisons: list[Comparison | None],
            expected: str = "better", **extra: object) -> dict:
    kept = [c for c in comparisons if c is not None]
    return {"id": identifier, "claim": claim, "test": test, "verdict": verdict(kept, expected),
            "comparisons": [c.as_dict() for c in kept], **extra}


# ------------------------------------------------------------------------ the claims
def all_findings(configurations: list[Configuration], results: list[RunResult], points: list[dict]) -> list[dict]:
    base = baseline([c for c in configurations if not exit_loss_scale(c)])
    # The paper's claims are about layer dropout alone: a configuration that also trains its
    # exits (the early-exit loss) is judged only by the two early-exit-loss findings.
    dropped = [c for c in configurations if not c.dense and not exit_loss_scale(c)]
    recommended = [c for c in dropped if dropout(c)["distribution"] == "increasing"
                   and dropout(c)["schedule"] == "decreasing" and dropout(c) == {**dropout(c), **RECOMMENDED}]
    found = []

    comparisons = [judge(c, base, val_loss, configurations) for c in recommended] if base else []
    found.append(finding(
        "headline", "With ILD+DTS, LLMs reach lower or similar validation loss for the same training steps while "
        "saving training FLOPs (abstract; Table 3: 271M +0.46% at P̄ 5%, 503M/906M at or below dense)",
        "ILD+DTS (layer, per-sequence, r_train=1/ρ) vs dense, same steps", comparisons,
        note="'within noise' here means the similar loss the claim allows"))

    found.append(_pareto(recommended, base))

    pairs = twins(configurations, "structure", "sublayer", "layer")
    found.append(finding("finding-1", "Layer dropout (whole blocks) gives lower loss than sub-layer dropout",
                         "sub-layer vs layer at the same settings",
                         [judge(x, y, val_loss, configurations) for x, y in pairs], expected="worse"))

    pairs = twins(configurations, "mask", "batch", "sequence")
    found.append(finding("finding-2", "Per-sequence dropout gives lower loss than per-batch",
                         "per-batch vs per-sequence masks at the same settings",
                         [judge(x, y, val_loss, configurations) for x, y in pairs], expected="worse"))

    comparisons = []
    for uniform in [c for c in dropped if dropout(c)["distribution"] == "uniform" and dropout(c)["schedule"] == "constant"]:
        for other in dropped:
            d = dropout(other)
            if d["distribution"] in ("increasing", "alternating") and d["schedule"] == "constant" \
                    and math.isclose(p_bar(other), p_bar(uniform)) and _same_rest(other, uniform):
                comparisons.append(judge(other, uniform, val_loss, configurations))
    found.append(finding("finding-3", "At the same training FLOPs, a non-uniform distribution over layers "
                         "(ILD, ALD) gives lower loss than uniform", "ILD and ALD vs uniform at equal P̄, constant "
                         "schedule", comparisons))

    comparisons = []
    for dts in recommended:
        for other in dropped:
            d = dropout(other)
            if d["distribution"] == "increasing" and d["schedule"] in ("constant", "increasing") \
                    and math.isclose(p_bar(other), p_bar(dts)) and _same_rest(other, dts):
                comparisons.append(judge(dts, other, val_loss, configurations))
    found.append(finding("finding-4", "For a fixed training FLOPs budget, a schedule decaying to zero (DTS) gives "
                         "the lowest loss, below constant and increasing (ITS) schedules",
                         "ILD+DTS vs ILD constant and ILD+ITS at equal P̄", comparisons))

    found.append(_early_exit(recommended, base, configurations))
    found.extend(_early_exit_loss(configurations))
    found.append(_correlation(points))

    comparisons = []
    for ald in [c for c in dropped if dropout(c)["distribution"] == "alternating"]:
        for other in [c for c in dropped if dropout(c)["distribution"] == "increasing"
                      and math.isclose(p_bar(c), p_bar(ald))] + ([base] if base else []):
            comparisons.append(judge(ald, other, alternate_skip_loss, configurations))
    found.append(finding("skip-ald", "ALD gives the best robustness to skipping alternate layers (Figs 6, A.3c)",
                         "loss with the odd layers skipped: ALD vs ILD at equal P̄ and vs dense", comparisons))

    pairs = twins(configurations, "r_train", "inverse_density", "one")
    found.append(finding("r-train", "r_train = 1/ρ is what lets hyperparameters transfer across dropout rates "
                         "(§5); at transferred hyperparameters it should not lose to r_train = 1",
                         "r_train = 1/ρ vs 1 at the same settings (hyperparameters transferred, not retuned)",
                         [judge(x, y, val_loss, configurations) for x, y in pairs]))

    comparisons = [judge(c, base, speculative_speedup, configurations, higher_is_better=True)
                   for c in dropped if base and c.values(speculative_speedup)]
    found.append(finding("speculative", "Models trained with layer dropout get higher self-speculative speedups "
                         "(Table 4: 1.01x dense vs 1.20-1.43x at 270M-906M)",
                         "best searched draft's measured speedup vs dense (higher is better)", comparisons))
    return found


def _same_rest(x: Configuration, y: Configuration) -> bool:
    keys = ("structure", "mask", "r_train")
    return all(dropout(x)[k] == dropout(y)[k] for k in keys) and _same_outside_dropout(x, y)


def alternate_skip_loss(run: RunResult) -> float | None:
    report = run.eval_with("results")
    if report is None:
        return None
    odd = [i for i in range(1, run.num_layers, 2)]
    found = [r["loss"] for r in report["results"] if list(r["skip_layers"]) == odd]
    return found[0] if found else None


def speculative_speedup(run: RunResult) -> float | None:
    report = run.eval_with("best")
    best = report.get("best") if report else None
    return float(best["speedup"]) if isinstance(best, dict) and "speedup" in best else None


def _pareto(recommended: list[Configuration], base: Configuration | None) -> dict:
    """Fig 9's claim on the validation curves: at the training FLOPs a dropout run ended
    with, the dense runs' curves (interpolated) were higher."""
    comparisons = []
    for configuration in recommended if base else []:
        finals = [(r.curve["training_flops"][-1], r.curve["val_loss"][-1]) for r in configuration.runs if r.curve]
        if not finals:
            continue
        budget = statistics.fmean(f for f, _ in finals)
        dense = [_interpolate_curve(r.curve, budget) for r in base.runs if r.curve]
        dense = [d for d in dense if d is not None]
        if not dense:
            continue
        sigma, _ = pooled_std([[v for _, v in finals], dense])
        comparisons.append(compare([v for _, v in finals], dense, sigma, None, configuration.label,
                                   f"{base.label} at the same FLOPs"))
    return finding("pareto", "At the same training FLOPs, training with layer dropout reaches lower loss "
                   "(Fig 9, abstract)", "end-of-training validation (the training-time val set) vs the dense curves "
                   "interpolated at the same executed FLOPs", comparisons)


def _interpolate_curve(curve: dict, flops: float) -> float | None:
    xs, ys = curve["training_flops"], curve["val_loss"]
    for (x0, y0), (x1, y1) in zip(zip(xs, ys), zip(xs[1:], ys[1:])):
        if x0 <= flops <= x1:
            return y0 + (y1 - y0) * (flops - x0) / (x1 - x0)
    return None


def _early_exit(recommended: list[Configuration], base: Configuration | None,
                configurations: list[Configuration]) -> dict:
    comparisons = []
    for configuration in recommended if base else []:
        for k in range(1, configuration.first.num_layers):
            metric = _exit_metric(k)
            comparison = judge(configuration, base, metric, configurations, with_eval_noise=False)
            if comparison is not None:
                comparison.a = f"{configuration.label}, exit {k}"
                comparisons.append(comparison)
    return finding("early-exit", "Pre-training with layer dropout always leads to better early-exit loss "
                   "(Key takeaway 2, Fig 5); decreasing schedules keep it (Finding 5)",
                   "exit loss at every exit 1..L-1: ILD+DTS vs dense", comparisons)


def _early_exit_loss(configurations: list[Configuration]) -> list[dict]:
    """What LayerSkip's early-exit loss buys at the exits and costs at the last layer: each
    configuration trained with it against its twin without it (equal in everything else,
    layer dropout included)."""
    pairs = [(x, y) for x in configurations for y in configurations
             if exit_loss_scale(x) and not exit_loss_scale(y) and _strip(x, "model.early_exit_loss.") ==
             _strip(y, "model.early_exit_loss.")]
    at_exits, at_last = [], []
    for x, y in pairs:
        for k in range(1, x.first.num_layers):
            for metric, higher, what in ((_exit_metric(k), False, f"exit {k} loss"),
                                         (_exit_draft_speedup(k), True, f"exit-{k} draft speedup")):
                comparison = judge(x, y, metric, configurations, higher_is_better=higher, with_eval_noise=False)
                if comparison is not None:
                    comparison.a, comparison.b = f"{x.label}: {what}", y.label
                    at_exits.append(comparison)
        at_last.append(judge(x, y, val_loss, configurations))
    return [
        finding("early-exit-loss", "Training with the early-exit loss lowers the loss at the early exits and so "
                "raises the speedup of exit drafts in self-speculative decoding (LayerSkip)",
                "with vs without the early-exit loss, the same layer dropout: exit loss at every exit 1..L-1 "
                "(lower is better) and the measured speedup of each `speculate run` exit draft (higher is better)",
                at_exits),
        finding("early-exit-loss-cost", "The early-exit loss costs the last layer little (LayerSkip)",
                "final-layer held-out loss with vs without the early-exit loss, the same layer dropout", at_last,
                note="'within noise' is the small cost the claim allows; 'not reproduced' means a cost beyond the "
                     "noise, and the comparison's difference is its size"),
    ]


def _strip(configuration: Configuration, prefix: str) -> dict:
    """The configuration's settings but those under ``prefix``."""
    return {k: v for k, v in json.loads(configuration.key).items() if not k.startswith(prefix)}


def _exit_draft_speedup(k: int) -> Metric:
    def metric(run: RunResult) -> float | None:
        found = [e["speedup"] for e in run.evals.values() if e.get("exit_layer") == k and "speedup" in e]
        return float(found[0]) if found else None

    metric.__name__ = f"exit_draft_{k}_speedup"
    return metric


def _exit_metric(k: int) -> Metric:
    def metric(run: RunResult) -> float | None:
        exits = run.exit_loss
        return None if not exits or k not in exits else exits[k]

    metric.__name__ = f"exit_{k}"
    return metric


def _correlation(points: list[dict], permutations: int = 20000) -> dict:
    """Finding 6: higher P̄, smaller degradation (a negative rank correlation), with a
    two-sided permutation p-value."""
    tests = {}
    for key in ("exit_degradation", "skip_degradation"):
        usable = [p for p in points if p[key] is not None]
        x = [p["mean_dropout_achieved"] for p in usable]
        y = [p[key] for p in usable]
        rho = spearman(x, y)
        if rho is None:
            continue
        rng = random.Random(0)
        extreme = sum(abs(spearman(x, rng.sample(y, len(y))) or 0) >= abs(rho) - 1e-12 for _ in range(permutations))
        tests[key] = {"spearman": rho, "p_value": (extreme + 1) / (permutations + 1), "runs": len(usable)}
    if not tests:
        verdict_ = "not tested"
    elif all(t["spearman"] < 0 and t["p_value"] < 0.05 for t in tests.values()):
        verdict_ = "reproduced"
    elif any(t["spearman"] > 0 and t["p_value"] < 0.05 for t in tests.values()):
        verdict_ = "not reproduced"
    else:
        verdict_ = "within noise"
    return {"id": "finding-6", "claim": "The average training dropout rate P̄ predicts zero-shot robustness to "
            "early exit and layer skipping", "test": "Spearman rank correlation over runs between P̄ achieved and "
            "the mean early-exit / skip degradation (expected negative; permutation p-value)",
            "verdict": verdict_, "correlations": tests, "comparisons": []}


__all__ = ["all_findings", "twins", "judge", "verdict", "alternate_skip_loss", "speculative_speedup"]

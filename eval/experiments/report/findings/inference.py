"""The paper's inference-side findings: early exit, layer skipping, speculative decoding,
and what LayerSkip's early-exit loss buys (comparisons and verdicts: verdicts.py beside this).

Finding 6's correlation takes configurations as its units (the mean over a configuration's
seeds), not runs: the seeds of one configuration are not independent evidence about how
P̄ relates to robustness. Its p-value is a two-sided permutation test (exact up to 8
configurations, else 20,000 random permutations).
"""

from __future__ import annotations

import itertools
import math
import random

from eval.experiments.report.findings.paper import CLAIMS
from eval.experiments.report.tables import (Configuration, configuration_points, dense_twin, spearman,
                                            val_loss)
from eval.experiments.sweep.results import RunResult
from eval.experiments.report.findings.verdicts import (Metric, correlation_verdict, dropout, exit_loss_scale, finding,
                                                       judge, p_bar, same_rest, strip)

EXACT_UP_TO = 8  # 8! = 40,320 permutations


def inference_findings(main: list[Configuration], configurations: list[Configuration],
                       recommended: list[Configuration], dropped: list[Configuration],
                       points: list[dict]) -> list[dict]:
    found = [_early_exit(recommended, main, configurations), *_early_exit_loss(main, configurations),
             _correlation(points)]

    comparisons = []
    for ald in [c for c in dropped if dropout(c)["distribution"] == "alternating"]:
        twin = dense_twin(ald, main)
        ild = [c for c in dropped if dropout(c)["distribution"] == "increasing" and dropout(c)["schedule"] == "constant"
               and math.isclose(p_bar(c), p_bar(ald)) and same_rest(c, ald)]
        for other in ild + ([twin] if twin else []):
            comparisons.append(judge(ald, other, alternate_skip_loss, configurations))
    found.append(finding("skip-ald", "ALD gives the best robustness to skipping alternate layers (Figs 6, A.3c)",
                         "loss with the odd layers skipped: ALD vs ILD (constant) at equal P̄ and vs dense",
                         comparisons))

    comparisons = []
    for configuration in dropped:
        twin = dense_twin(configuration, main)
        if twin is not None and configuration.values(speculative_speedup):
            comparisons.append(judge(configuration, twin, speculative_speedup, configurations, higher_is_better=True))
    found.append(finding("speculative", "Models trained with layer dropout get higher self-speculative speedups "
                         "(Table 4: 1.01x dense vs 1.20-1.43x at 270M-906M)",
                         "best searched draft's measured speedup vs dense (greedy, on held-out prompts where the run "
                         "decoded it with `speculate run --draft-from`; higher is better)", comparisons))
    return found


def alternate_skip_loss(run: RunResult) -> float | None:
    report = run.eval_with("results")
    if report is None:
        return None
    odd = [i for i in range(1, run.num_layers, 2)]
    found = [r["loss"] for r in report["results"] if list(r["skip_layers"]) == odd]
    return found[0] if found else None


def speculative_speedup(run: RunResult) -> float | None:
    """The speedup of the run's searched draft: decoded greedily on held-out prompts by
    `speculate run --draft-from` where the run has that evaluation (docs/RULES.md, 2026-12-06),
    else as the search's confirmation measured its best skip set."""
    held_out = [e["speedup"] for e in run.evals.values()
                if e.get("draft_from") and e.get("mode") == "greedy" and "speedup" in e]
    if held_out:
        return float(held_out[0])
    report = run.eval_with("best")
    best = report.get("best") if report else None
    return float(best["speedup"]) if isinstance(best, dict) and "speedup" in best else None


def _early_exit(recommended: list[Configuration], main: list[Configuration],
                configurations: list[Configuration]) -> dict:
    comparisons = []
    for configuration in recommended:
        twin = dense_twin(configuration, main)
        for k in range(1, configuration.first.num_layers) if twin else ():
            comparison = judge(configuration, twin, exit_metric(k), configurations, with_eval_noise=False)
            if comparison is not None:
                comparison.a = f"{configuration.label}, exit {k}"
                comparisons.append(comparison)
    return finding("early-exit", "Pre-training with layer dropout always leads to better early-exit loss "
                   "(Key takeaway 2, Fig 5); decreasing schedules keep it (Finding 5)",
                   "exit loss at every exit 1..L-1: ILD+DTS vs dense", comparisons)


def _early_exit_loss(main: list[Configuration], configurations: list[Configuration]) -> list[dict]:
    """What LayerSkip's early-exit loss buys at the exits and costs at the last layer: each
    configuration trained with it against its twin without it (equal in everything else,
    layer dropout included)."""
    pairs = [(x, y) for x in main for y in main
             if exit_loss_scale(x) and not exit_loss_scale(y) and strip(x, "model.early_exit_loss.") ==
             strip(y, "model.early_exit_loss.")]
    at_exits, at_last = [], []
    for x, y in pairs:
        for k in range(1, x.first.num_layers):
            for metric, higher, what in ((exit_metric(k), False, f"exit {k} loss"),
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


def _exit_draft_speedup(k: int) -> Metric:
    def metric(run: RunResult) -> float | None:
        found = [e["speedup"] for e in run.evals.values() if e.get("exit_layer") == k and "speedup" in e
                 and not e.get("draft_from") and e.get("mode", "greedy") == "greedy"]  # the fixed greedy draft
        return float(found[0]) if found else None

    metric.__name__ = f"exit_draft_{k}_speedup"
    return metric


def exit_metric(k: int) -> Metric:
    def metric(run: RunResult) -> float | None:
        exits = run.exit_loss
        return None if not exits or k not in exits else exits[k]

    metric.__name__ = f"exit_{k}"
    return metric


def permutation_p(x: list[float], y: list[float], rho: float, permutations: int = 20000) -> float:
    """Two-sided: the share of orderings of y whose |ρ| reaches |ρ| (exact for few units)."""
    if len(y) <= EXACT_UP_TO:
        orders = list(itertools.permutations(y))
        return sum(abs(spearman(x, list(o)) or 0) >= abs(rho) - 1e-12 for o in orders) / len(orders)
    rng = random.Random(0)
    extreme = sum(abs(spearman(x, rng.sample(y, len(y))) or 0) >= abs(rho) - 1e-12 for _ in range(permutations))
    return (extreme + 1) / (permutations + 1)


def _correlation(points: list[dict]) -> dict:
    """Finding 6: higher P̄, smaller degradation (a negative rank correlation), configurations as units.
    The nominal P̄ (the schedule's; configurations at one P̄ tie) decides; the achieved P̄ (the masks',
    which orders configurations of one nominal P̄ by sampling noise in its fourth decimal) is shown beside."""
    tests, achieved = {}, {}
    for key in ("exit_degradation", "skip_degradation"):
        for p_bar, found in (("mean_dropout_predicted", tests), ("mean_dropout_achieved", achieved)):
            units = configuration_points(points, key, p_bar)
            x, y = [u[0] for u in units], [u[1] for u in units]
            rho = spearman(x, y)
            if rho is None:
                continue
            found[key] = {"spearman": rho, "p_value": permutation_p(x, y, rho), "configurations": len(units),
                          "distinct_p_bar": len(set(x)), "p_bar": p_bar,
                          "runs": sum(1 for p in points if p[key] is not None and not p.get("compute_matched")
                                      and not p.get("early_exit_loss"))}
    return {"id": "finding-6", "claim": "The average training dropout rate P̄ predicts zero-shot robustness to "
            "early exit and layer skipping", "paper": CLAIMS["finding-6"],
            "test": "Spearman rank correlation over configurations (each the mean over its seeds) between the "
            "nominal P̄ (the schedule's: configurations at one P̄ tie, average ranks) and the mean early-exit / "
            "skip degradation (expected negative; permutation p-value, exact up to 8 configurations); the "
            "achieved P̄ beside it", "expected": "better", "verdict": correlation_verdict(tests),
            "correlations": tests, "achieved_correlations": achieved, "comparisons": []}


__all__ = ["inference_findings", "alternate_skip_loss", "speculative_speedup", "exit_metric", "permutation_p"]

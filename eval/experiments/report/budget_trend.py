"""The paper's Fig. 8 view: does each finding's gap move with the training budget?

    layerdrop report sweeps/paper-cpu-6tpp --out docs/reproduction-6tpp --across docs/reproduction

Fig. 8 of the paper trains the same grid at several tokens per parameter (TPP) and finds the
ILD+DTS gap to dense stable across them. ``--across`` gives `layerdrop report` the report.json
of the same grid at other budgets; this module pairs their comparisons with this report's
and asks, for each, whether the gap at the largest budget differs from the gap at the
smallest beyond the noise of both:

    change = (a − b at the largest TPP) − (a − b at the smallest TPP),
    SE = √(SE_large² + SE_small²),   a two-sided t test on the smaller of the two dofs

(the two budgets are independent runs, so their errors add). Verdicts: **stable**, or
**moved** with the direction ("a − b rose": a lost ground against b with more tokens). The seeds
guard (docs/RULES.md): a row is never "stable" when every seed's gap at the largest budget lies
beyond the smallest budget's gap, on one side, by more than 2 pooled seed σ of the largest. Where a
budget flagged a configuration's spread, the change is also tested on that budget's other
analysis (significance.without_flagged) and shown beside where its verdict differs.

A comparison is the same one at two budgets when its finding, a, b and metric are, with a
compute-matched baseline's step count dropped ("dense, 822 steps (compute-matched)" at one
budget is "dense, 2465 steps (compute-matched)" at the other). Per-exit comparisons (the
early-exit finding's dozens of rows) are left to the exits plot.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Sequence

from matplotlib.figure import Figure

from eval.experiments.report.significance import ALPHA, t_two_sided_p
from eval.measurements import plots

_MATCHED_STEPS = re.compile(r", \d+ steps \(compute-matched\)")


def main_shape(report: dict) -> dict | None:
    """The model shape (and length) most of a report's runs trained at."""
    shapes = (report.get("model") or {}).get("shapes") or []
    return max(shapes, key=lambda s: s["runs"]) if shapes else None


def tokens_per_parameter(report: dict) -> float | None:
    """The budget of a report: the TPP of its main shape."""
    shape = main_shape(report)
    return shape["tokens_per_parameter"] if shape else None


def comparison_key(finding: str, comparison: dict) -> tuple[str, str, str, str]:
    a, b = (_MATCHED_STEPS.sub(", compute-matched", comparison[side]) for side in ("a", "b"))
    return finding, a, b, str(comparison.get("metric"))


def _comparisons(report: dict) -> dict[tuple, dict]:
    found = {}
    for finding in report.get("findings") or []:
        for comparison in finding["comparisons"]:
            if str(comparison.get("metric", "")).startswith("exit_") or comparison.get("diff") is None:
                continue
            found.setdefault(comparison_key(finding["id"], comparison), comparison)
    return found


def _point(tpp: float, source: str, comparison: dict) -> dict:
    reference = comparison.get("reference")
    se = comparison.get("se")
    return {"tokens_per_parameter": tpp, "source": source, "diff": comparison["diff"], "pct": comparison.get("pct"),
            "se": se, "pct_se": 100 * se / reference if se is not None and reference else None,
            "dof": comparison.get("dof"), "verdict": comparison.get("verdict_holm") or comparison.get("verdict"),
            "observation": bool(comparison.get("observation")),
            "seed_gaps": list((comparison.get("seed_gaps") or {}).values()), "seed_sigma": comparison.get("seed_sigma"),
            "alternative": comparison.get("alternative")}


def _seeds_apart(small: dict, large: dict) -> str | None:
    """"rose" / "fell" when every seed's gap at the larger budget lies beyond the smaller budget's
    gap on one side by more than 2 pooled σ of the larger budget (the seeds guard); else None."""
    gaps, sigma = large.get("seed_gaps") or [], large.get("seed_sigma")
    if not gaps or sigma is None:
        return None
    if all(g - small["diff"] > 2 * sigma for g in gaps):
        return "rose"
    if all(g - small["diff"] < -2 * sigma for g in gaps):
        return "fell"
    return None


def change(small: dict, large: dict, alpha: float = ALPHA) -> dict:
    """The change of a − b from the smallest budget's point to the largest's, and its test."""
    delta = large["diff"] - small["diff"]
    apart = _seeds_apart(small, large)
    if small["se"] is None or large["se"] is None or not small["dof"] or not large["dof"]:
        return {"change": delta, "change_se": None, "p_value": None, "seeds_apart": apart,
                "verdict": f"moved: a − b {apart}" if apart else "no noise estimate"}
    se = math.hypot(small["se"], large["se"])
    p_value = t_two_sided_p(delta / se, min(small["dof"], large["dof"])) if se > 0 else 0.0
    if p_value < alpha:
        verdict = f"moved: a − b {'rose' if delta > 0 else 'fell'}"
    else:
        verdict = f"moved: a − b {apart}" if apart else "stable"
    return {"change": delta, "change_se": se, "p_value": p_value, "seeds_apart": apart, "verdict": verdict}


def other_analysis(small: dict, large: dict, alpha: float = ALPHA) -> dict | None:
    """The change tested on each budget's other analysis (its flagged configurations out of the
    pool), where either budget has one; None where neither does."""
    if not small.get("alternative") and not large.get("alternative"):
        return None
    points = [{**p, **{k: (p["alternative"] or {}).get(k, p[k]) for k in ("diff", "se", "dof")},
               "seed_gaps": None} if p.get("alternative") else {**p, "seed_gaps": None} for p in (small, large)]
    found = change(*points, alpha=alpha)
    return {k: found[k] for k in ("change", "change_se", "p_value", "verdict")}


def trend(report: dict, source: str, others: Sequence[tuple[str, dict]]) -> dict:
    """Every comparison found at this budget and at least one other, ordered by budget."""
    budgets = [(tokens_per_parameter(report), source, _comparisons(report))]
    budgets += [(tokens_per_parameter(other), name, _comparisons(other)) for name, other in others]
    budgets = sorted((b for b in budgets if b[0] is not None), key=lambda b: b[0])
    rows = []
    for key in budgets[-1][2].keys() | budgets[0][2].keys():
        points = [_point(tpp, name, found[key]) for tpp, name, found in budgets if key in found]
        if len(points) < 2:
            continue
        finding, a, b, metric = key
        rows.append({"finding": finding, "a": a, "b": b, "metric": metric, "points": points,
                     **change(points[0], points[-1]), "alternative": other_analysis(points[0], points[-1])})
    order = [f["id"] for f in report.get("findings") or []]
    rows.sort(key=lambda r: (order.index(r["finding"]) if r["finding"] in order else len(order), r["a"], r["b"]))
    return {"budgets": [{"tokens_per_parameter": tpp, "source": name} for tpp, name, _ in budgets],
            "alpha": ALPHA, "rows": rows}


def trend_figure(section: dict) -> Figure:
    """%Δ of each loss comparison vs TPP (log axis), ± 2 SE."""
    fig = Figure(figsize=(7.2, 4.6))
    ax = fig.subplots()
    rows = [r for r in section["rows"] if r["metric"] == "val_loss" and all(p["pct"] is not None for p in r["points"])]
    colour_of = plots.colours([f"{r['a']} vs {r['b']}" for r in rows])
    for index, row in enumerate(rows):
        label = f"{row['a']} vs {row['b']}"
        x = [p["tokens_per_parameter"] for p in row["points"]]
        y = [p["pct"] for p in row["points"]]
        errors = [2 * p["pct_se"] if p["pct_se"] is not None else 0.0 for p in row["points"]]
        ax.errorbar(x, y, yerr=errors, color=colour_of[label], marker=plots.MARKERS[index % len(plots.MARKERS)],
                    markersize=4, capsize=3, linestyle="--" if row["points"][0]["observation"] else "-",
                    label=label)
    ax.axhline(0.0, color="black", linewidth=0.8)
    ax.set_xscale("log")
    ax.set_xticks([b["tokens_per_parameter"] for b in section["budgets"]])
    ax.set_xticklabels([f"{b['tokens_per_parameter']:.1f}" for b in section["budgets"]])
    ax.set_xlabel("tokens per non-embedding parameter")
    ax.set_ylabel("a − b, % of b's loss (± 2 SE)")
    ax.set_title("The gaps across budgets (Fig. 8's view)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6, loc="best")
    return fig


def write_trend_figure(section: dict, path: Path) -> Path | None:
    if not any(r["metric"] == "val_loss" for r in section["rows"]):
        return None
    return plots.save(trend_figure, path, section)


__all__ = ["main_shape", "tokens_per_parameter", "comparison_key", "change", "other_analysis", "trend", "trend_figure",
           "write_trend_figure"]

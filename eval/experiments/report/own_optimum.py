"""Each configuration at its own weight decay: per configuration its τ_EMA points, its best point and
bracket, whether λ matters for it, the comparison at its own optimum beside the same-λ one, and the
τ_EMA that carries to the next budget.

The rules are docs/lambda-6tpp/PROTOCOL.md's, registered before the runs they judge:

- a *configuration* here is its layer-dropout settings with everything else but τ_EMA
  (``model.parametrization.tau_ema``): the report's configurations that differ only in τ_EMA are
  its points, each with its seeds. Compute-matched runs (another length) are no point;
- its **best point**: the τ_EMA of lowest mean held-out loss over the seeds it has;
- its bracket is **closed** when the best point has a neighbour on each side on the grid (every
  τ_EMA the report's configurations ran) and it and both neighbours have ≥ 2 seeds; else
  **open**, and nothing is said about its optimum;
- σ: the seed standard deviation pooled over every (configuration, τ_EMA) cell of the report with
  ≥ 2 seeds, none left out (docs/RULES.md); two points of n₁ and n₂ seeds are apart when their
  means differ by more than 2σ·√(1/n₁ + 1/n₂). Points within that of the best are **tied** with it;
- **λ matters** for C when C's and dense's brackets are closed, C's optimum τ*_C differs from
  dense's τ*_dense, and C's mean at τ*_dense exceeds its mean at τ*_C by more than that margin
  (the optimum moves). Otherwise λ does not matter for C within the noise; with a bracket open
  nothing is said;
- **at its own optimum**: C at τ*_C against dense at τ*_dense (both brackets closed), unpaired
  unless both have the very same seeds there, the pooled noise, two-sided t at α = 0.05, and one of
  the page's Holm tests (findings/verdicts.py); beside it the **same-λ** comparison of the
  configuration table, both at the reference τ_EMA;
- **what carries** to the next budget (the 20-TPP runs): τ*_C where λ matters, else the dense λ,
  which the protocol carries unchanged: the reference τ_EMA, that of the report's dense baseline
  (tables.baseline: the dense configuration of the sweep's length with the most seeds).

The dense configuration C is set against is the one equal to it in every setting but the layer
dropout, the early-exit loss and τ_EMA (as tables.dense_twin, τ_EMA aside).
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field

from eval.experiments.report.page_table import p_text as _p, table as _table
from eval.experiments.report.significance import ALPHA, pooled_std
from eval.experiments.report.tables import (DROPOUT_PREFIX, Configuration, baseline, compare_configurations,
                                            val_loss)

TAU = "model.parametrization.tau_ema"
EARLY_EXIT_PREFIX = "model.early_exit_loss."


@dataclass
class Points:
    """One configuration's cells: τ_EMA -> the report's configuration run at it."""

    label: str
    dense: bool
    settings: dict  # every setting but τ_EMA
    cells: dict[float, Configuration] = field(default_factory=dict)

    def outside_dropout(self) -> dict:
        return {k: v for k, v in self.settings.items() if not k.startswith((DROPOUT_PREFIX, EARLY_EXIT_PREFIX))}


def label_without_tau(label: str) -> str:
    """The configuration's label with its ``tau_ema=…`` part (sweep/results.py's label) taken out."""
    return ", ".join(part for part in label.split(", ") if not part.startswith("tau_ema="))


def points_of(configurations: list[Configuration]) -> list[Points]:
    """The report's configurations grouped by every setting but τ_EMA, in report order."""
    found: dict[str, Points] = {}
    for configuration in configurations:
        settings = json.loads(configuration.key) if configuration.key else {}
        tau = settings.pop(TAU, None)
        if tau is None or configuration.compute_matched:
            continue
        key = json.dumps(settings, sort_keys=True, default=str)
        group = found.setdefault(key, Points(label_without_tau(configuration.label), configuration.dense, settings))
        group.cells[float(tau)] = configuration
    return list(found.values())


def margin(sigma: float | None, n_1: int, n_2: int) -> float | None:
    """2σ·√(1/n₁ + 1/n₂): how far apart two points' means must be to differ beyond the noise."""
    return None if sigma is None else 2 * sigma * math.sqrt(1 / n_1 + 1 / n_2)


def _point(tau: float, configuration: Configuration) -> dict:
    per_seed = {str(r.seed if r.seed is not None else r.name): r.val_loss for r in configuration.runs
                if r.val_loss is not None}
    losses = list(per_seed.values())
    finite = bool(losses) and all(math.isfinite(v) for v in losses)
    return {"tau_ema": tau, "configuration": configuration.label, "seeds": len(losses), "per_seed": per_seed,
            "mean": statistics.fmean(losses) if finite else math.inf,
            "std": statistics.stdev(losses) if finite and len(losses) > 1 else None}


def bracket(group: Points, grid: list[float], sigma: float | None) -> dict:
    """The configuration's points (ties with the best marked), its best point and whether its
    bracket is closed."""
    points = [_point(tau, group.cells[tau]) for tau in sorted(group.cells)]
    best = min(points, key=lambda p: p["mean"])
    for point in points:
        point["best"] = point is best
        point["margin"] = None if point is best else margin(sigma, point["seeds"], best["seeds"])
        point["tied"] = point is not best and point["margin"] is not None and math.isfinite(best["mean"]) \
            and point["mean"] - best["mean"] <= point["margin"]
    seeds = {p["tau_ema"]: p["seeds"] for p in points}
    index = grid.index(best["tau_ema"])
    neighbours = [grid[i] for i in (index - 1, index + 1) if 0 <= i < len(grid)]
    short = [tau for tau in (best["tau_ema"], *neighbours) if seeds.get(tau, 0) < 2]
    if len(neighbours) < 2:
        why = f"the best point, τ_EMA {best['tau_ema']:g}, is at the grid's edge"
    elif short:
        why = "fewer than 2 seeds at τ_EMA " + ", ".join(
            f"{tau:g} ({seeds[tau] if seeds.get(tau) else 'not run'})" for tau in short)
    else:
        why = f"the best point, τ_EMA {best['tau_ema']:g}, and both neighbours have ≥ 2 seeds"
    return {"points": points, "best": best["tau_ema"], "closed": len(neighbours) == 2 and not short, "why": why}


def lambda_rule(mine: dict, dense: dict | None, sigma: float | None) -> dict:
    """Does λ matter for the configuration (``mine``: its bracket) against dense's bracket?"""
    if dense is None:
        return {"verdict": "not tested", "text": "no dense configuration with its other settings"}
    if not mine["closed"]:
        return {"verdict": "open", "text": "its bracket is open: no statement about its optimum"}
    if not dense["closed"]:
        return {"verdict": "open", "text": "dense's bracket is open: no statement about where the optimum lies"}
    if sigma is None:
        return {"verdict": "not tested", "text": "no noise estimate (no cell has 2 seeds)"}
    if mine["best"] == dense["best"]:
        return {"verdict": "does not matter", "at": dense["best"],
                "text": f"the same optimum as dense's (τ_EMA {dense['best']:g})"}
    at = {p["tau_ema"]: p for p in mine["points"]}
    there, own = at.get(dense["best"]), at[mine["best"]]
    if there is None:
        return {"verdict": "not tested", "at": dense["best"],
                "text": f"no run at dense's optimum (τ_EMA {dense['best']:g})"}
    gap, limit = there["mean"] - own["mean"], margin(sigma, there["seeds"], own["seeds"])
    moves = gap > limit
    return {"verdict": "matters" if moves else "does not matter", "at": dense["best"], "gap": gap, "margin": limit,
            "seeds": [there["seeds"], own["seeds"]],
            "text": f"at dense's optimum (τ_EMA {dense['best']:g}) {gap:+.4f} against its own "
                    f"{'>' if moves else '≤'} 2σ·√(1/{there['seeds']} + 1/{own['seeds']}) = {limit:.4f}: "
                    + ("the optimum moves" if moves else "λ does not matter within the noise")}


def carried(group: Points, rule: dict | None, mine: dict, dense: dict | None, reference: float | None) -> dict:
    """The τ_EMA the configuration's runs at the next budget use, and why (PROTOCOL.md)."""
    if group.dense:
        note = f"; its own optimum here is τ_EMA {mine['best']:g}" \
            if mine["closed"] and reference is not None and mine["best"] != reference else ""
        return {"tau_ema": reference, "why": f"dense's λ, carried unchanged{note}"}
    if rule and rule["verdict"] == "matters":
        return {"tau_ema": mine["best"], "why": "its own optimum: λ matters"}
    why = {"open": "open bracket: the dense λ", "does not matter": "λ does not matter within the noise: the dense λ"}
    return {"tau_ema": reference, "why": why.get(rule["verdict"] if rule else "", "not tested: the dense λ")}


def own_optimum(configurations: list[Configuration], rows: list[dict]) -> dict | None:
    """The section's numbers for report.json (None when no configuration ran two τ_EMA, or none
    has layer dropout: a dense-only τ_EMA sweep is a tuning, its curves are the hyperparameter section's)."""
    groups = points_of(configurations)
    if not any(len(g.cells) > 1 for g in groups) or all(g.dense for g in groups):
        return None
    grid = sorted({tau for g in groups for tau in g.cells})
    sigma, dof = pooled_std([c.values(val_loss) for c in configurations])
    base = baseline(configurations)
    reference = json.loads(base.key).get(TAU) if base is not None and base.key else None
    reference = None if reference is None else float(reference)
    same_lambda = {row["configuration"]: row.get("vs_dense") for row in rows}
    brackets = {id(g): bracket(g, grid, sigma) for g in groups}
    entries = []
    for group in sorted(groups, key=lambda g: not g.dense):
        mine = brackets[id(group)]
        dense_group = next((g for g in groups if g.dense and g.outside_dropout() == group.outside_dropout()), None)
        dense = brackets[id(dense_group)] if dense_group is not None else None
        rule = None if group.dense else lambda_rule(mine, dense, sigma)
        entry = {"configuration": group.label, "dense": group.dense, **mine, "lambda": rule,
                 "carries": carried(group, rule, mine, dense, reference)}
        if not group.dense:
            entry["dense_configuration"] = dense_group.label if dense_group else None
            entry["dense_best"] = dense["best"] if dense and dense["closed"] else None
            comparison = None
            if dense is not None and mine["closed"] and dense["closed"]:
                comparison = compare_configurations(group.cells[mine["best"]], dense_group.cells[dense["best"]],
                                                    val_loss, configurations, same_seeds_only=True)
            entry["at_own_optimum"] = comparison.as_dict() if comparison else None
            cell = group.cells.get(reference) if reference is not None else None
            entry["same_lambda"] = same_lambda.get(cell.label) if cell is not None else None
        entries.append(entry)
    return {"key": TAU, "grid": grid, "reference_tau_ema": reference, "seed_std": sigma, "seed_dof": dof,
            "alpha": ALPHA, "configurations": entries}


def comparisons(section: dict | None) -> list[dict]:
    """The section's comparisons at each configuration's own optimum: some of the page's Holm tests."""
    return [e["at_own_optimum"] for e in (section or {}).get("configurations", []) if e.get("at_own_optimum")]


# ------------------------------------------------------------------------ the page
def markdown_section(section: dict | None) -> list[str]:
    """README.md's section "Each configuration at its own weight decay" (none without it)."""
    if not section:
        return []
    grid, entries, reference = section["grid"], section["configurations"], section["reference_tau_ema"]
    noise = "no σ yet (no cell has 2 seeds)" if section["seed_std"] is None else \
        f"σ = {section['seed_std']:.4f} nats pooled over every (configuration, τ_EMA) cell with ≥ 2 seeds, " \
        f"{section['seed_dof']} degrees of freedom"
    lines = ["## Each configuration at its own weight decay", "",
             "The rules of docs/lambda-6tpp/PROTOCOL.md (eval/experiments/report/own_optimum.py). Per configuration "
             "(its layer-dropout settings), the held-out loss at each τ_EMA it ran: mean ± std over seeds (seeds); "
             "**bold**: its best point (lowest mean); \"=\": tied with it, within 2σ·√(1/n₁ + 1/n₂) of it "
             f"({noise}). The bracket is **closed** when the best point has a grid neighbour on each side and it "
             "and both neighbours have ≥ 2 seeds; an open bracket says nothing about the optimum. λ: whether the "
             "optimum moves from dense's (both closed, C's mean at dense's optimum above its own by more than "
             "the margin).", ""]
    rows = []
    for entry in entries:
        at = {p["tau_ema"]: p for p in entry["points"]}
        rows.append([entry["configuration"], *(_point_cell(at[tau]) if tau in at else "" for tau in grid),
                     f"{entry['best']:g}", f"{'closed' if entry['closed'] else 'open'}: {entry['why']}",
                     "–" if entry["lambda"] is None else entry["lambda"]["text"]])
    lines += _table(["configuration", *(f"τ_EMA {tau:g}" for tau in grid), "best", "bracket",
                     "λ against dense's optimum"], rows)
    same = "the reference τ_EMA" if reference is None else f"τ_EMA {reference:g}"
    lines += ["", "### At its own optimum, beside the same λ", "",
              "Each configuration at its best τ_EMA against dense at its best (both brackets closed; unpaired "
              "unless both have the very same seeds there; the pooled σ, two-sided t at α = "
              f"{section['alpha']}, Holm over the page's tests), and beside it the same-λ comparison of the "
              f"configuration table (both at {same}): a − b in loss (% of b) ± 1 SE.", ""]
    rows = [[entry["configuration"], _own(entry), _comparison(entry.get("same_lambda"))]
            for entry in entries if not entry["dense"]]
    lines += _table(["configuration", "at its own optimum (vs dense at its own)", f"same λ ({same})"], rows)
    lines += ["", "### What carries to 20 TPP", "",
              "The τ_EMA each configuration's runs at the next budget use: its closed optimum where λ matters, "
              "else the dense λ (an open bracket included), which the protocol carries unchanged.", ""]
    lines += _table(["configuration", "τ_EMA", "why"],
                    [[e["configuration"], "–" if e["carries"]["tau_ema"] is None else f"{e['carries']['tau_ema']:g}",
                      e["carries"]["why"]] for e in entries])
    return lines + [""]


def _point_cell(point: dict) -> str:
    if point["mean"] == math.inf:
        return "diverged"
    text = f"{point['mean']:.4f}" + (f" ± {point['std']:.4f}" if point["std"] is not None else "") \
        + f" ({point['seeds']})"
    return f"**{text}**" if point["best"] else f"= {text}" if point["tied"] else text


def _own(entry: dict) -> str:
    if entry.get("at_own_optimum") is None:
        return "– (" + ("its bracket is open" if not entry["closed"] else "dense's bracket is open"
                        if entry.get("dense_configuration") else "no dense configuration") + ")"
    return f"τ_EMA {entry['best']:g} vs {entry['dense_best']:g}: {_comparison(entry['at_own_optimum'])}"


def _comparison(c: dict | None) -> str:
    if not c:
        return "–"
    how = [f"paired over {c['paired']} seeds" if c.get("paired") else "unpaired"]
    if c.get("p_value") is not None:
        how.append(f"p = {_p(c['p_value'])}" + (f", Holm {_p(c['p_holm'])}" if c.get("p_holm") is not None else ""))
    se = f" ± {c['se']:.4f}" if c.get("se") is not None else ""
    text = f"{c['diff']:+.4f} ({c['pct']:+.2f}%){se} ({'; '.join(how)}) → {c['verdict']}"
    if c.get("verdict_holm") and c["verdict_holm"] != c["verdict"]:
        text += f" (after Holm: {c['verdict_holm']})"
    if c.get("seeds_beyond") and c.get("seed_sigma") is not None:
        gaps = ", ".join(f"{g:+.4f}" for g in (c.get("seed_gaps") or {}).values())
        text += f" [every seed {c['seeds_beyond']} by > 2σ = {2 * c['seed_sigma']:.4f}: {gaps}]"
    return text


__all__ = ["TAU", "Points", "points_of", "label_without_tau", "margin", "bracket", "lambda_rule", "carried",
           "own_optimum", "comparisons", "markdown_section"]

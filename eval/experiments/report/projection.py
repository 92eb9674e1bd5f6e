"""A budget not yet trained, projected from two that were, and the rule registered to judge it.

    layerdrop report docs/reproduction-6tpp --across docs/reproduction --project 20.56 \\
        --out docs/reproduction-20tpp

writes projection.md and projection.json (no report) before a run of the new budget exists;
the report of that budget, given ``--projection docs/reproduction-20tpp/projection.json``,
sets its numbers beside the projection and applies the registered rule (``judge``).

**Points.** For every configuration both budgets share, two gaps in % of the comparison's
loss (report.json's numbers, nothing re-derived): *equal steps*, the configuration against
its dense twin (the configuration table's ``vs_dense``), and *equal FLOPs*, against the dense
run trained to its executed FLOPs (the ``pareto`` finding). Each point is y ± s on ν degrees
of freedom (s = 100·SE/reference, ν the noise estimate's dof of its report).

**Two fits through the two largest budgets** (x = ln TPP, k = (x* − x₂)/(x₂ − x₁), x* the target):

- *a line in log TPP*: y* = (1 + k)·y₂ − k·y₁, Var = (1 + k)²·s₂² + k²·s₁²;
- *a power law* |y| = c·TPPᵇ (both points of one sign): ln|y*| = (1 + k)·ln|y₂| − k·ln|y₁|,
  Var(ln|y*|) = (1 + k)²·(s₂/y₂)² + k²·(s₁/y₁)² (the delta method: Var(ln|y|) ≈ (s/y)²).

Each point's SE is propagated through the fit as above (the budgets are independent runs);
the 95% interval is ± t·SE, t the two-sided 5% critical value of Student's t on the
Welch–Satterthwaite dof of the combination, ν = V² / Σ (cᵢ·sᵢ)⁴/νᵢ; the power law's interval
is exp(ln|y*| ± t·SE) with y*'s sign. The power law is undefined when the points differ in
sign, and its interval when a point lies within its own 95% noise of zero (the log of its
magnitude then has no usable error).

**The rule** (``RULE``, copied into projection.json, which registers it): ``judge`` reads it
from the file, not from this module, so a later change here cannot move a registered rule.
"""

from __future__ import annotations

import math
import re
from typing import Sequence

from eval.experiments.report.budget_trend import tokens_per_parameter
from eval.experiments.report.significance import ALPHA, critical_t, holm

EQUAL_STEPS, EQUAL_FLOPS = "equal steps", "equal FLOPs"
# The configurations whose equal-FLOPs edge the new budget decides (issue 43): the P̄ 10% and 20% rows
# the 20-TPP grid trains.
JUDGED = ("ILD+DTS p_max=0.4", "ILD+DTS p_max=0.8, r_train=1", "ILD+ITS p_max=0.8")
RULE = {
    "judged": list(JUDGED),
    "comparison": "each judged configuration's final held-out loss minus that of the dense run trained to its "
                  "total training FLOPs (blocks and unembedding, as recipes/sweeps/paper-cpu-20tpp.yaml's "
                  "flops_matched counts them) with its own full schedule (the report's equal-FLOPs comparison), "
                  "paired over "
                  "shared seeds, its noise pooled over every configuration of the new budget's report with none "
                  "left out (docs/RULES.md)",
    "test": f"two-sided Student t of the difference against 0 at α = {ALPHA} on the pooled noise's degrees of "
            "freedom, Holm's adjustment over the judged comparisons found",
    "verdicts": {"survives": "lower than the matched dense beyond the noise after Holm",
                 "gone": "within the noise after Holm",
                 "reversed": "higher than the matched dense beyond the noise after Holm"},
    "level": "a P̄ level's edge survives when at least one judged configuration at that P̄ survives",
    "inside": "beside each verdict, and for every projected row: whether the new budget's %Δ lies inside each "
              "projection's 95% interval (log-line, power law); a row judged at another τ_EMA than the two budgets "
              "it was projected from is marked so",
}
# Settings a label carries when they vary within a sweep; a row is the same one at another λ or η
# (each configuration may train at its own weight decay: docs/lambda-6tpp/PROTOCOL.md).
_SETTING = re.compile(r", (?:tau_ema|lr|init_std)=[^,]+")
_MATCHED_STEPS = re.compile(r", \d+ steps \(compute-matched\)")


def row_label(label: str) -> str:
    """A configuration's label without the hyperparameters that joined it."""
    return _SETTING.sub("", label)


def settings_of(label: str) -> list[str]:
    """The hyperparameters a label carries (``["tau_ema=0.15"]``), sorted."""
    return sorted(m.group(0)[2:] for m in _SETTING.finditer(label))


def points(report: dict) -> dict[tuple[str, str], dict]:
    """(equal steps | equal FLOPs, configuration) -> {pct, pct_se, dof, verdict, seeds} of one report."""
    found: dict[tuple[str, str], dict] = {}
    for row in report.get("configurations") or []:
        comparison = row.get("vs_dense")
        if comparison and comparison.get("pct") is not None:
            found[(EQUAL_STEPS, row_label(row["configuration"]))] = _point(comparison, row["configuration"])
    for finding in report.get("findings") or []:
        if finding["id"] != "pareto":
            continue
        for comparison in finding["comparisons"]:
            if "compute-matched" in comparison["b"] and comparison.get("pct") is not None:
                found.setdefault((EQUAL_FLOPS, row_label(comparison["a"])), _point(comparison, comparison["a"]))
    return found


def _point(comparison: dict, label: str) -> dict:
    se, reference = comparison.get("se"), comparison.get("reference")
    return {"pct": comparison["pct"], "pct_se": 100 * se / reference if se is not None and reference else None,
            "dof": comparison.get("dof"), "p_value": comparison.get("p_value"),
            "verdict": comparison.get("verdict_holm") or comparison.get("verdict"), "label": label,
            "b": row_label(_MATCHED_STEPS.sub(", compute-matched", comparison["b"])),
            "same_settings": settings_of(label) == settings_of(comparison["b"]), "seeds": comparison.get("paired"),
            "seeds_beyond": comparison.get("seeds_beyond")}


def _interval(centre: float, terms: Sequence[tuple[float, float]]) -> tuple[float, float, float] | None:
    """(SE, dof, t) of Σ cᵢ·yᵢ from its terms (cᵢ·sᵢ, νᵢ): Welch–Satterthwaite dof, t at 95%."""
    if any(not math.isfinite(c) or not dof for c, dof in terms):
        return None
    variance = math.fsum(c * c for c, _ in terms)
    if variance <= 0:
        return None
    dof = variance ** 2 / math.fsum(c ** 4 / d for c, d in terms)
    return math.sqrt(variance), dof, critical_t(dof)


def log_line(small: dict, large: dict, k: float) -> dict:
    """A line in log TPP through the two points, read at the target (module docstring)."""
    centre = (1 + k) * large["pct"] - k * small["pct"]
    if small["pct_se"] is None or large["pct_se"] is None:
        return {"pct": centre, "low": None, "high": None, "se": None, "dof": None, "note": "no noise estimate"}
    found = _interval(centre, [((1 + k) * large["pct_se"], large["dof"]), (k * small["pct_se"], small["dof"])])
    if found is None:
        return {"pct": centre, "low": None, "high": None, "se": None, "dof": None, "note": "no noise estimate"}
    se, dof, t = found
    return {"pct": centre, "low": centre - t * se, "high": centre + t * se, "se": se, "dof": dof, "note": None}


def power_law(small: dict, large: dict, k: float) -> dict:
    """|y| = c·TPPᵇ through the two points, read at the target (module docstring)."""
    y1, y2 = small["pct"], large["pct"]
    if y1 == 0 or y2 == 0 or (y1 > 0) != (y2 > 0):
        return {"pct": None, "low": None, "high": None, "exponent": None,
                "note": "undefined: the two budgets' gaps differ in sign (or one is 0)"}
    sign = 1.0 if y2 > 0 else -1.0
    log_centre = (1 + k) * math.log(abs(y2)) - k * math.log(abs(y1))
    centre = sign * math.exp(log_centre)
    result = {"pct": centre, "low": None, "high": None, "exponent": None, "note": None}
    result["exponent"] = math.log(abs(y2) / abs(y1))  # b·(x₂ − x₁); report.json keeps b below
    if small["pct_se"] is None or large["pct_se"] is None or not small["dof"] or not large["dof"]:
        return {**result, "note": "no noise estimate"}
    near_zero = [p for p in (small, large) if abs(p["pct"]) < critical_t(p["dof"]) * p["pct_se"]]
    if near_zero:
        return {**result, "note": "no interval: a budget's gap is within its own 95% noise of 0 "
                                  f"({near_zero[0]['pct']:+.2f}% ± {near_zero[0]['pct_se']:.2f})"}
    found = _interval(log_centre, [((1 + k) * large["pct_se"] / abs(y2), large["dof"]),
                                   (k * small["pct_se"] / abs(y1), small["dof"])])
    if found is None:
        return {**result, "note": "no noise estimate"}
    se, dof, t = found
    ends = sorted(sign * math.exp(log_centre + s * t * se) for s in (-1, 1))
    return {**result, "low": ends[0], "high": ends[1], "log_se": se, "dof": dof}


def project(reports: Sequence[tuple[str, dict]], target_tpp: float) -> dict:
    """Every row found at the two largest budgets below ``target_tpp``, projected to it."""
    budgets = sorted(((tokens_per_parameter(r), name, r) for name, r in reports if tokens_per_parameter(r)),
                     key=lambda b: b[0])
    below = [b for b in budgets if b[0] < target_tpp]
    if len(below) < 2:
        raise ValueError(f"--project {target_tpp:g} needs two budgets below it: the reports given have "
                         + (", ".join(f"{b[0]:.2f} TPP" for b in budgets) or "none") + " (add one with --across)")
    (tpp1, name1, small), (tpp2, name2, large) = below[-2:]
    k = (math.log(target_tpp) - math.log(tpp2)) / (math.log(tpp2) - math.log(tpp1))
    first, second = points(small), points(large)
    rows = []
    for key in sorted(first.keys() & second.keys(), key=lambda key: (key[1], key[0] != EQUAL_STEPS)):
        p1, p2 = first[key], second[key]
        law = power_law(p1, p2, k)
        if law["exponent"] is not None:
            law["exponent"] = law["exponent"] / (math.log(tpp2) - math.log(tpp1))
        rows.append({"kind": key[0], "configuration": key[1], "b": p2["b"],
                     "points": [{"tokens_per_parameter": tpp1, **p1}, {"tokens_per_parameter": tpp2, **p2}],
                     "log_line": log_line(p1, p2, k), "power_law": law})
    return {"target_tokens_per_parameter": target_tpp, "k": k,
            "budgets": [{"tokens_per_parameter": tpp, "source": name, "noise": _noise(report)}
                        for tpp, name, report in ((tpp1, name1, small), (tpp2, name2, large))],
            "rows": rows, "rule": RULE}


def _noise(report: dict) -> dict:
    """The noise a report's SEs came from (which configurations, if any, it left out of the pool)."""
    noise = report.get("noise") or {}
    return {"seed_std": noise.get("seed_std"), "seed_dof": noise.get("seed_dof"),
            "residual_std": noise.get("residual_std"), "residual_dof": noise.get("residual_dof"),
            # reports before docs/RULES.md left an "unstable" configuration out of the pool; now one is only flagged
            "left_out": [u["configuration"] for u in noise.get("unstable") or []],
            "flagged": [u["configuration"] for u in noise.get("flagged") or []]}


def _inside(fit: dict, pct: float | None) -> bool | None:
    if pct is None or fit.get("low") is None:
        return None
    return fit["low"] <= pct <= fit["high"]


def judge(report: dict, projection: dict) -> dict:
    """The registered rule (projection["rule"]) applied to the new budget's report."""
    rule = projection["rule"]
    found = points(report)
    # the rule is applied to whatever has finished; while the sweep has runs to go, its noise (and the
    # seeds paired) can still change, so a verdict then is the rule's reading so far, not the budget's answer
    unfinished = report.get("skipped_runs") or []
    judged = [(label, found.get((EQUAL_FLOPS, label))) for label in rule["judged"]]
    present = [(label, point) for label, point in judged if point is not None and point["p_value"] is not None]
    adjusted = dict(zip((label for label, _ in present), holm([point["p_value"] for _, point in present])))
    verdicts = []
    for label, point in judged:
        if point is None or label not in adjusted:
            # run, but no p-value: no configuration has two seeds yet, so the budget has no seed noise
            verdicts.append({"configuration": label, "point": point,
                             "verdict": "not measured" if point is None else "not judged yet (no seed noise)"})
            continue
        beyond = adjusted[label] < ALPHA
        # docs/RULES.md's seeds guard: never "within the noise" (gone) when every seed lies beyond the
        # matched dense one way by more than 2 pooled σ — the report marks such a comparison seeds_beyond
        guarded = None if beyond else point.get("seeds_beyond")
        direction = ("better" if point["pct"] < 0 else "worse") if beyond else guarded
        verdict = {"better": "survives", "worse": "reversed", None: "gone"}[direction]
        verdicts.append({"configuration": label, "verdict": verdict, "p_holm": adjusted[label], "point": point,
                         "seeds_guard": guarded is not None, "provisional": bool(unfinished)})
    rows = []
    for row in projection["rows"]:
        point = found.get((row["kind"], row["configuration"]))
        pct = point["pct"] if point else None
        rows.append({"kind": row["kind"], "configuration": row["configuration"], "point": point,
                     "inside_log_line": _inside(row["log_line"], pct),
                     "inside_power_law": _inside(row["power_law"], pct),
                     # projected from same-λ gaps; a configuration at its own λ against dense at dense's is another gap
                     "other_settings": bool(point) and not point["same_settings"]})
    return {"tokens_per_parameter": tokens_per_parameter(report), "verdicts": verdicts, "rows": rows,
            "projected_to": projection["target_tokens_per_parameter"], "unfinished_runs": len(unfinished)}


# ------------------------------------------------------------------------ the pages
def _pct(value: float | None, se: float | None = None) -> str:
    if value is None:
        return "–"
    return f"{value:+.2f}%" + (f" ± {se:.2f}" if se is not None else "")


def _fit(fit: dict) -> str:
    if fit["pct"] is None:
        return fit["note"]
    text = _pct(fit["pct"])
    if fit["low"] is not None:
        text += f" [{fit['low']:+.2f}, {fit['high']:+.2f}]"
    return text + (f" ({fit['note']})" if fit.get("note") else "")


def projection_markdown(projection: dict, *, command: str | None = None, commit_note: str | None = None) -> str:
    budgets = projection["budgets"]
    target = projection["target_tokens_per_parameter"]
    rule = projection["rule"]
    lines = [f"# The projection to {target:.1f} tokens per parameter (registered before its runs)", "",
             "Written by `layerdrop report --project` (eval/experiments/report/projection.py) from the reports of "
             + " and ".join(f"{b['tokens_per_parameter']:.1f} TPP ({b['source']})" for b in budgets)
             + "; every number is in projection.json beside this file. The commit that adds these two files "
             "registers the projection and the rule below; the report of the new budget reads the rule from "
             "projection.json (`layerdrop report ... --projection projection.json`).", ""]
    if command:
        lines += ["```bash", command, "```", ""]
    if commit_note:
        lines += [commit_note, ""]
    lines += ["## How it is computed", "",
              "Each row is a gap in % of the comparison's loss at both budgets (y ± s, s = 100·SE/reference, the SE "
              "and its degrees of freedom ν from each report's pooled noise). With x = ln TPP and "
              f"k = (x* − x₂)/(x₂ − x₁) = {projection['k']:.4f}:", "",
              "- **line in log TPP**: y* = (1 + k)·y₂ − k·y₁, SE² = (1 + k)²·s₂² + k²·s₁²;",
              "- **power law** |y| = c·TPPᵇ (both gaps of one sign): ln|y*| = (1 + k)·ln|y₂| − k·ln|y₁|, "
              "SE² of ln|y*| = (1 + k)²·(s₂/y₂)² + k²·(s₁/y₁)² (delta method); no interval when a gap lies within "
              "its own 95% noise of 0.", "",
              "Intervals are 95%: ± t·SE with t the two-sided 5% point of Student's t on the Welch–Satterthwaite "
              "degrees of freedom of the combination (ν = SE⁴ / Σ (cᵢ·sᵢ)⁴/νᵢ); the power law's is exponentiated. "
              "The two budgets are independent runs, so their errors add.", ""]
    for budget in budgets:
        noise = budget["noise"]
        if noise.get("residual_std") is None:
            continue
        left_out = (f"; left out of the pool: {', '.join(noise['left_out'])} (judged on its own spread there)"
                    if noise["left_out"] else "; no configuration left out of the pool")
        if noise.get("flagged"):
            left_out += f" (flagged, kept in: {', '.join(noise['flagged'])})"
        lines.append(f"- {budget['tokens_per_parameter']:.1f} TPP ({budget['source']}): paired σ = "
                     f"{noise['residual_std']:.4f} nats ({noise['residual_dof']} dof), seed σ = "
                     f"{noise['seed_std']:.4f} ({noise['seed_dof']} dof){left_out}.")
    lines += ["", "## The projection", ""]
    header = ["gap", "configuration vs", *(f"{b['tokens_per_parameter']:.1f} TPP" for b in budgets),
              f"line in log TPP at {target:.1f}", f"power law at {target:.1f} (exponent b)"]
    table = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for row in projection["rows"]:
        cells = [row["kind"], f"{row['configuration']} vs {row['b']}",
                 *(_pct(p["pct"], p["pct_se"]) for p in row["points"]), _fit(row["log_line"]),
                 _fit(row["power_law"]) + (f", b = {row['power_law']['exponent']:+.2f}"
                                           if row["power_law"]["exponent"] is not None else "")]
        table.append("| " + " | ".join(cells) + " |")
    lines += table + ["", "## The rule that judges the new budget (registered)", "",
                      f"- **Which**: {', '.join(rule['judged'])}.",
                      f"- **Comparison**: {rule['comparison']}.",
                      f"- **Test**: {rule['test']}.",
                      "- **Verdicts**: " + "; ".join(f"*{k}*: {v}" for k, v in rule["verdicts"].items()) + ".",
                      f"- **Level**: {rule['level']}.",
                      f"- **Beside it**: {rule['inside']}.", ""]
    return "\n".join(lines + _earlier(projection))


def _earlier(projection: dict) -> list[str]:
    """Every version this file replaced (``--project --overwrite``), newest first: what it was made from
    and its judged rows at equal FLOPs, so a reader sees what moved and why."""
    if not projection.get("earlier"):
        return []
    lines = ["## Earlier versions of this projection (replaced, kept on record)", ""]
    for version in projection["earlier"]:
        lines += [f"`{version.get('projection_command', '?')}`", ""]
        for budget in version["budgets"]:
            noise = budget.get("noise") or {}
            if noise.get("residual_std") is not None:
                left = f"; left out of the pool: {', '.join(noise['left_out'])}" if noise.get("left_out") else ""
                lines.append(f"- {budget['tokens_per_parameter']:.1f} TPP: paired σ {noise['residual_std']:.4f} "
                             f"({noise['residual_dof']} dof){left}")
        for row in version["rows"]:
            if row["kind"] == EQUAL_FLOPS and row["configuration"] in version["rule"]["judged"]:
                lines.append(f"- {row['configuration']} at equal FLOPs: "
                             + ", ".join(_pct(p["pct"], p["pct_se"]) for p in row["points"])
                             + f" → line {_fit(row['log_line'])}, power law {_fit(row['power_law'])}")
        lines.append("")
    return lines


def judged_markdown(judged: dict) -> list[str]:
    """The section a report of the new budget shows (``--projection``)."""
    lines = ["## The registered projection, judged", "",
             f"The rule registered in projection.json before this budget's runs, applied to them "
             "(eval/experiments/report/projection.py). Verdicts: *survives* (lower than the matched dense after Holm "
             "over the judged comparisons), *gone* (within the noise), *reversed* (higher); never *gone* when every "
             "seed lies beyond its matched dense one way by more than 2 pooled σ (docs/RULES.md's seeds guard).", ""]
    if judged.get("unfinished_runs"):
        lines += [f"**Provisional**: {judged['unfinished_runs']} of the sweep's runs are not in this report (listed "
                  "at the top), so the seed noise and the pairs below can still change; a verdict marked "
                  "provisional is the rule applied to the runs so far, not this budget's answer.", ""]
    for verdict in judged["verdicts"]:
        point = verdict["point"]
        numbers = "" if point is None else f": {_pct(point['pct'], point['pct_se'])}" + (
            f", Holm p = {verdict['p_holm']:.3g}" if verdict.get("p_holm") is not None else "")
        marks = ["provisional"] if verdict.get("provisional") else []
        if verdict.get("seeds_guard"):
            marks.append("the seeds guard: every seed beyond the matched dense by > 2 pooled σ")
        mark = f" ({'; '.join(marks)})" if marks else ""
        lines.append(f"- {verdict['configuration']} at equal FLOPs: **{verdict['verdict']}**{mark}{numbers}")
    lines += ["", "| gap | configuration | this budget | inside the log-line interval | inside the power-law "
              "interval |", "|---|---|---|---|---|"]
    for row in judged["rows"]:
        point = row["point"]
        now = "not run" if point is None else _pct(point["pct"], point["pct_se"]) + (
            " (other settings than projected)" if row["other_settings"] else "")
        answer = {True: "yes", False: "no", None: "–"}
        lines.append(f"| {row['kind']} | {row['configuration']} | {now} | {answer[row['inside_log_line']]} | "
                     f"{answer[row['inside_power_law']]} |")
    return lines + [""]


__all__ = ["EQUAL_STEPS", "EQUAL_FLOPS", "JUDGED", "RULE", "row_label", "settings_of", "points", "log_line",
           "power_law", "project", "judge", "projection_markdown", "judged_markdown"]

"""The "Choosing a configuration" table: what each recommended configuration costs and buys, per budget.

    layerdrop report sweeps/paper-cpu-6tpp --out docs/reproduction-6tpp --across docs/reproduction

A user deciding on p_max wants four numbers per configuration, not the findings page: the
loss cost at equal steps (and the paper's Table 3 figure at the same P̄), the loss at equal
executed FLOPs against a dense run trained to them with its own schedule, the training FLOPs
saved, and what the middle exit gains. This module reads them out of report.json documents
(this report and every ``--across`` one), one row per listed configuration and budget — the numbers
and verdicts (after Holm) the findings already computed, nothing re-derived — so the
The reproducing guide's table (docs/guide/reproducing.md) is a copy of the report's and a test can hold them equal.

Listed: the paper's recommended form, "ILD+DTS p_max=X" (layer granularity, per-sequence masks,
r_train = 1/ρ), and beside it at the same P̄ the same with the schedule increasing (ILD+ITS) or
constant (ILD) over time, since which schedule to use is part of the choice; ILD+DTS with r_train = 1
(at P̄ 20% the best option at equal FLOPs at 2.1 and 6.2 TPP) and with the early-exit loss (what
its exits buy and its heads cost); other variants stay on the findings page. Rows are ordered by P̄,
then schedule, then variant, then budget.

Each verdict is the one after Holm where the comparison is one of the page's tests; a comparison
that is an observation (not among the tests, so never Holm-adjusted: the equal-FLOPs rows other
than ILD+DTS) carries its raw verdict, marked "raw". FLOPs saved are given in both conventions:
non-embedding (the blocks, the paper's) / total (blocks, unembedding and early-exit heads).
"""

from __future__ import annotations

import re
from typing import Sequence

from eval.experiments.report.budget_trend import main_shape, tokens_per_parameter

SCHEDULES = ("ILD+DTS", "ILD+ITS", "ILD")  # decreasing (the paper's), increasing, constant over time
VARIANTS = ("", "r_train=1", "early-exit loss")
LISTED = re.compile(r"(ILD\+DTS|ILD\+ITS|ILD) p_max=([0-9.]+)(?:, (r_train=1))?(?: \+ (early-exit loss) .+)?")
HEADER = ["configuration", "P̄", "budget", "seeds", "FLOPs saved (non-embedding / total)", "loss at equal steps",
          "paper (Table 3, 271M)", "loss at equal FLOPs", "middle-exit gain"]


def _findings(report: dict) -> dict[str, list[dict]]:
    return {f["id"]: f["comparisons"] for f in report.get("findings") or []}


def _first(comparisons: list[dict], **match) -> dict | None:
    return next((c for c in comparisons if all(c.get(k) == v for k, v in match.items())), None)


def _verdict(comparison: dict) -> str:
    """After Holm for one of the page's tests; the raw verdict, marked so, for an observation."""
    if comparison.get("p_holm") is None and comparison.get("observation"):
        return f"{comparison['verdict']}, raw"
    return comparison.get("verdict_holm") or comparison["verdict"]


def _pct(comparison: dict | None) -> dict | None:
    """%Δ ± SE (in % of b's loss) and its verdict, or None where there is no such comparison."""
    if comparison is None or comparison.get("pct") is None:
        return None
    reference, se = comparison.get("reference"), comparison.get("se")
    return {"pct": comparison["pct"], "pct_se": 100 * se / reference if se is not None and reference else None,
            "verdict": _verdict(comparison)}


def rows(report: dict) -> list[dict]:
    """The dense row and one row per listed configuration of one report."""
    tpp = tokens_per_parameter(report)
    findings = _findings(report)
    at_equal_steps = findings.get("headline", []) + findings.get("cost-at-equal-steps", [])
    shape = main_shape(report)
    middle = shape["n_layers"] // 2 if shape else None
    found = []
    for configuration in report.get("configurations") or []:
        label = configuration["configuration"]
        row = {"configuration": label, "tokens_per_parameter": tpp, "seeds": configuration["seeds"],
               "flops_saved_pct": configuration.get("training_flops_saved_pct"),
               "total_flops_saved_pct": configuration.get("total_flops_saved_pct")}
        if label == "dense":
            found.append({**row, "p_bar": 0.0, "schedule": "", "p_max": 0.0, "val_loss": configuration["val_loss_mean"],
                          "val_loss_std": configuration.get("val_loss_std")})
            continue
        listed = LISTED.fullmatch(label)
        if not listed:
            continue
        paper = _first(at_equal_steps, a=label, b="dense")
        matched = next((c for c in findings.get("pareto", [])
                        if c["a"] == label and "compute-matched" in c["b"] and c.get("pct") is not None), None)
        exit_gain = _first(findings.get("early-exit", []), a=f"{label}, exit {middle}", b="dense") or \
            _first(findings.get("early-exit-loss", []), a=f"{label}: exit {middle} loss")  # against its twin
        found.append({**row, "p_bar": configuration.get("mean_dropout_predicted") or 0.0,
                      "schedule": listed.group(1), "p_max": float(listed.group(2)),
                      "variant": listed.group(3) or listed.group(4) or "",
                      "equal_steps": _pct(configuration.get("vs_dense")),
                      "paper_pct": paper.get("paper_pct") if paper else None,
                      "equal_flops": _pct(matched), "matched_to": matched["b"] if matched else None,
                      "middle_exit": middle,
                      "exit_gain": None if exit_gain is None else
                      {"diff": exit_gain["diff"], "se": exit_gain.get("se"), "verdict": _verdict(exit_gain),
                       "against": exit_gain["b"]}})
    return found


def choosing(reports: Sequence[dict]) -> list[dict]:
    """Every budget's rows, each configuration's budgets side by side (smallest TPP first)."""
    every = [row for report in reports for row in rows(report) if row["tokens_per_parameter"] is not None]
    return sorted(every, key=lambda r: (round(r["p_bar"], 4), SCHEDULES.index(r["schedule"]) if r["schedule"] else -1,
                                        VARIANTS.index(r.get("variant", "")), r["p_max"], r["tokens_per_parameter"]))


def _with_se(point: dict | None) -> str:
    if point is None:
        return "–"
    se = f" ± {point['pct_se']:.2f}" if point["pct_se"] is not None else ""
    return f"{point['pct']:+.2f}%{se} ({point['verdict']})"


def markdown_rows(table: list[dict]) -> list[list[str]]:
    cells = []
    for row in table:
        saved = "–" if row["flops_saved_pct"] is None else f"{row['flops_saved_pct']:.1f}%" + (
            "" if row.get("total_flops_saved_pct") is None else f" / {row['total_flops_saved_pct']:.1f}%")
        budget = f"{row['tokens_per_parameter']:.1f} TPP"
        p_bar = f"{100 * row['p_bar']:.0f}%"
        if row["p_max"] == 0.0:
            std = f" ± {row['val_loss_std']:.3f}" if row.get("val_loss_std") is not None else ""
            cells.append([row["configuration"], p_bar, budget, str(row["seeds"]), saved,
                          f"loss {row['val_loss']:.3f}{std}", "–", "–", "–"])
            continue
        paper = "–" if row["paper_pct"] is None else f"{row['paper_pct']:+.2f}%"
        matched = "no compute-matched baseline" if row["equal_flops"] is None else _with_se(row["equal_flops"])
        gain = row["exit_gain"]
        against = "" if gain is None or gain.get("against", "dense") == "dense" else f" vs {gain['against']}"
        exit_text = "–" if gain is None else (
            f"{gain['diff']:+.3f}" + (f" ± {gain['se']:.3f}" if gain["se"] is not None else "")
            + f" nats at exit {row['middle_exit']}{against} ({gain['verdict']})")
        cells.append([row["configuration"], p_bar, budget, str(row["seeds"]), saved, _with_se(row["equal_steps"]),
                      paper, matched, exit_text])
    return cells


def markdown_table(table: list[dict]) -> list[str]:
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "|".join("---" for _ in HEADER) + "|"]
    return lines + ["| " + " | ".join(cells) + " |" for cells in markdown_rows(table)]


__all__ = ["SCHEDULES", "VARIANTS", "LISTED", "HEADER", "rows", "choosing", "markdown_rows", "markdown_table"]

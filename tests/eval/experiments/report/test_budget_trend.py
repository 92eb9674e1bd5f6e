"""The Fig. 8 view: gaps paired across two budgets, their change and its test, by hand."""

import json
import math

import pytest

from eval.experiments.report.budget_trend import change, comparison_key, other_analysis, trend
from eval.experiments.report.build import main
from eval.experiments.report.significance import t_two_sided_p
from tests.eval.experiments.run_folders import slices, write_run


def _point(diff, se, dof, tpp=1.0):
    return {"tokens_per_parameter": tpp, "diff": diff, "se": se, "dof": dof}


def test_a_change_beyond_both_budgets_noise_moves_and_one_within_it_is_stable():
    moved = change(_point(0.02, 0.01, 4), _point(0.10, 0.01, 6))
    assert moved["change"] == pytest.approx(0.08) and moved["change_se"] == pytest.approx(0.01 * math.sqrt(2))
    assert moved["p_value"] == pytest.approx(t_two_sided_p(0.08 / (0.01 * math.sqrt(2)), 4))  # the smaller dof
    assert moved["verdict"] == "moved: a − b rose"
    assert change(_point(0.02, 0.01, 4), _point(-0.06, 0.01, 6))["verdict"] == "moved: a − b fell"
    stable = change(_point(0.02, 0.01, 4), _point(0.03, 0.01, 6))
    assert stable["verdict"] == "stable" and stable["p_value"] > 0.05
    assert change(_point(0.02, None, 0), _point(0.03, 0.01, 6))["verdict"] == "no noise estimate"


def test_a_compute_matched_baseline_is_the_same_comparison_at_any_length():
    short = comparison_key("pareto", {"a": "ILD+DTS p_max=0.8", "b": "dense, 822 steps (compute-matched)",
                                      "metric": "val_loss"})
    long = comparison_key("pareto", {"a": "ILD+DTS p_max=0.8", "b": "dense, 2465 steps (compute-matched)",
                                     "metric": "val_loss"})
    assert short == long == ("pareto", "ILD+DTS p_max=0.8", "dense, compute-matched", "val_loss")


def _report(tpp: float, comparisons: list[dict]) -> dict:
    return {"model": {"shapes": [{"tokens_per_parameter": tpp, "runs": 5}, {"tokens_per_parameter": tpp / 2,
                                                                           "runs": 1}]},
            "findings": [{"id": "headline", "comparisons": comparisons}]}


def test_only_comparisons_found_at_two_budgets_are_paired_in_budget_order():
    here = _report(6.0, [{"a": "x", "b": "dense", "metric": "val_loss", "diff": 0.05, "pct": 1.0, "se": 0.01,
                          "dof": 8, "reference": 5.0},
                         {"a": "only here", "b": "dense", "metric": "val_loss", "diff": 0.0, "se": 0.01, "dof": 8},
                         {"a": "x, exit 1", "b": "dense", "metric": "exit_1", "diff": 0.3, "se": 0.01, "dof": 8}])
    there = _report(2.0, [{"a": "x", "b": "dense", "metric": "val_loss", "diff": 0.01, "pct": 0.2, "se": 0.02,
                           "dof": 4, "reference": 5.0}])
    section = trend(here, "this report", [("small", there)])
    assert [b["tokens_per_parameter"] for b in section["budgets"]] == [2.0, 6.0]  # the main shape's TPP
    [row] = section["rows"]
    assert (row["a"], row["b"]) == ("x", "dense") and [p["source"] for p in row["points"]] == ["small", "this report"]
    assert row["change"] == pytest.approx(0.04) and row["change_se"] == pytest.approx(math.hypot(0.01, 0.02))
    assert row["points"][1]["pct_se"] == pytest.approx(100 * 0.01 / 5.0)


def _sweep(root, steps, dropout_losses):
    for seed, mean in enumerate((3.00, 3.02, 3.01)):
        write_run(root, f"dense,seed={seed}", seed, slices(mean), steps=steps)
    for seed, mean in enumerate(dropout_losses):  # ILD+DTS at P̄ 5%: the headline's comparison
        write_run(root, f"p05,seed={seed}", seed, slices(mean), p_max=0.2, steps=steps)


def test_report_across_budgets_end_to_end(tmp_path, capsys):
    _sweep(tmp_path / "short", 100, (3.01, 3.03, 3.02))  # +0.01 at the short budget
    _sweep(tmp_path / "long", 300, (3.06, 3.08, 3.07))    # +0.06 at 3× the tokens
    assert main([str(tmp_path / "short"), "--out", str(tmp_path / "short-report")]) == 0
    out = tmp_path / "long-report"
    assert main([str(tmp_path / "long"), "--out", str(out), "--across", str(tmp_path / "short-report")]) == 0
    report = json.loads((out / "report.json").read_text())
    short = json.loads((tmp_path / "short-report" / "report.json").read_text())
    section = report["budgets"]
    ratio = section["budgets"][1]["tokens_per_parameter"] / section["budgets"][0]["tokens_per_parameter"]
    assert ratio == pytest.approx(3.0)
    [row] = [r for r in section["rows"] if r["finding"] == "headline"]
    assert row["points"][0]["diff"] == pytest.approx(0.01) and row["points"][1]["diff"] == pytest.approx(0.06)
    [small] = [f for f in short["findings"] if f["id"] == "headline"]
    [large] = [f for f in report["findings"] if f["id"] == "headline"]
    se = math.hypot(small["comparisons"][0]["se"], large["comparisons"][0]["se"])
    assert row["change"] == pytest.approx(0.05) and row["change_se"] == pytest.approx(se)
    text = (out / "README.md").read_text()
    assert "## Across budgets (Fig. 8's view)" in text and f"**{row['verdict']}**" in text
    assert (out / report["images"]["budgets"]).stat().st_size > 1000
    # the choosing table (eval/experiments/report/choosing.py): ILD+DTS p_max 0.2 at both budgets, +0.01 and +0.06
    # over dense's 3.01
    choosing = [(r["tokens_per_parameter"], r["equal_steps"]["pct"]) for r in report["choosing"] if r["p_max"]]
    assert [round(tpp / choosing[0][0], 6) for tpp, _ in choosing] == [1.0, 3.0]
    assert [pct for _, pct in choosing] == pytest.approx([100 * 0.01 / 3.01, 100 * 0.06 / 3.01], rel=1e-3)
    assert "## Choosing a configuration" in text
    # a folder that is not a report: one line, exit 2, nothing written
    capsys.readouterr()
    assert main([str(tmp_path / "long"), "--out", str(tmp_path / "x"), "--across", str(tmp_path / "long")]) == 2
    assert "--across" in capsys.readouterr().err and not (tmp_path / "x").exists()


def test_a_gap_whose_every_seed_moved_beyond_two_sigma_is_never_stable():
    """docs/RULES.md: the Fig. 8 view must not call +1.66% → +7.61% (seeds +6.5% / +8.8%) stable."""
    small = {**_point(0.077, 0.009, 21), "seed_gaps": [0.075, 0.08, 0.076], "seed_sigma": 0.011}
    large = {**_point(0.317, 0.2, 1), "seed_gaps": [0.27, 0.36], "seed_sigma": 0.019}
    found = change(small, large)
    assert found["p_value"] > 0.05 and found["seeds_apart"] == "rose" and found["verdict"] == "moved: a − b rose"
    # seeds that straddle the other budget's gap leave the t test to decide
    found = change(small, {**large, "seed_gaps": [0.05, 0.58]})
    assert found["seeds_apart"] is None and found["verdict"] == "stable"
    # the other analysis of a flagged budget is tested beside: its own SE and dof
    flagged = {**large, "alternative": {"diff": 0.317, "se": 0.05, "dof": 1.0, "verdict": "within noise"}}
    other = other_analysis(small, flagged)
    assert other["change_se"] == pytest.approx(math.hypot(0.009, 0.05))
    assert other["p_value"] == pytest.approx(t_two_sided_p(0.24 / math.hypot(0.009, 0.05), 1))
    assert other_analysis(small, large) is None

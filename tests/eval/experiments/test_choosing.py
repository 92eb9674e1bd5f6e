"""The "Choosing a configuration" table: numbers read out of hand-made reports, known by hand, and the
README's table held equal to the committed reports'."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eval.experiments.choosing import choosing, markdown_table, rows

ROOT = Path(__file__).resolve().parents[3]


def _comparison(a, b, *, diff=0.0, pct=None, se=0.02, verdict="within noise", holm=None, **more):
    return {"a": a, "b": b, "diff": diff, "pct": pct, "se": se, "reference": 4.0, "verdict": verdict,
            "verdict_holm": holm or verdict, "metric": "val_loss", **more}


def _report(tpp: float, pct: float, exit_gain: float) -> dict:
    label = "ILD+DTS p_max=0.4"
    return {
        "model": {"shapes": [{"tokens_per_parameter": tpp, "n_layers": 12, "runs": 4},
                             {"tokens_per_parameter": tpp * 0.9, "n_layers": 12, "runs": 1}]},
        "configurations": [
            {"configuration": "dense", "seeds": 3, "training_flops_saved_pct": 0.0, "val_loss_mean": 4.0,
             "val_loss_std": 0.01},
            {"configuration": label, "seeds": 2, "training_flops_saved_pct": 10.0, "mean_dropout_predicted": 0.1,
             "vs_dense": _comparison(label, "dense", diff=0.02, pct=pct, verdict="worse", holm="within noise")},
            # a variant other than the schedule: left to the findings page
            {"configuration": "ILD+DTS p_max=0.4, r_train=1", "seeds": 2, "training_flops_saved_pct": 10.0,
             "mean_dropout_predicted": 0.1, "vs_dense": _comparison("ILD+DTS p_max=0.4, r_train=1", "dense", pct=-1)},
            # the constant schedule at twice the P̄: listed, after every configuration of a smaller P̄
            {"configuration": "ILD p_max=0.4", "seeds": 2, "training_flops_saved_pct": 20.0,
             "mean_dropout_predicted": 0.2, "vs_dense": _comparison("ILD p_max=0.4", "dense", pct=1.0)},
            # the increasing schedule at the same P̄: after ILD+DTS
            {"configuration": "ILD+ITS p_max=0.4", "seeds": 1, "training_flops_saved_pct": 10.0,
             "mean_dropout_predicted": 0.1, "vs_dense": _comparison("ILD+ITS p_max=0.4", "dense", pct=0.2)},
        ],
        "findings": [
            {"id": "cost-at-equal-steps", "comparisons": [_comparison(label, "dense", pct=pct, paper_pct=0.82)]},
            {"id": "pareto", "comparisons": [
                _comparison("ILD p_max=0.4", "dense, 822 steps (compute-matched)", pct=-2.0, se=0.01),
                _comparison(label, "dense, 911 steps (compute-matched)", diff=-0.02, pct=-0.5, se=0.01,
                            verdict="better")]},
            {"id": "early-exit", "comparisons": [
                {**_comparison(f"{label}, exit 5", "dense", diff=-0.3), "metric": "exit_5"},
                {**_comparison(f"{label}, exit 6", "dense", diff=exit_gain, se=0.03, verdict="better"),
                 "metric": "exit_6"}]},
        ],
    }


def test_a_report_gives_dense_and_each_ild_dts_p_max_with_the_findings_numbers():
    dense, ild_dts, ild, ild_its = rows(_report(6.2, 0.5, -0.1))
    assert (ild["schedule"], ild["p_bar"], ild["matched_to"]) == ("ILD", 0.2, "dense, 822 steps (compute-matched)")
    assert (ild_its["schedule"], ild_its["equal_steps"]["pct"], ild_its["exit_gain"]) == ("ILD+ITS", 0.2, None)
    assert (dense["configuration"], dense["val_loss"], dense["seeds"]) == ("dense", 4.0, 3)
    assert ild_dts["configuration"] == "ILD+DTS p_max=0.4" and ild_dts["p_max"] == 0.4
    # %Δ ± SE in % of dense's loss (0.02 of 4.0 = 0.5%), the verdict after Holm
    assert ild_dts["equal_steps"] == {"pct": 0.5, "pct_se": pytest.approx(0.5), "verdict": "within noise"}
    assert ild_dts["paper_pct"] == 0.82
    # the compute-matched comparison of this configuration, not another's
    assert ild_dts["equal_flops"] == {"pct": -0.5, "pct_se": pytest.approx(0.25), "verdict": "better"}
    assert ild_dts["matched_to"] == "dense, 911 steps (compute-matched)"
    # the middle exit of 12 layers is exit 6
    assert ild_dts["middle_exit"] == 6 and ild_dts["exit_gain"] == {"diff": -0.1, "se": 0.03, "verdict": "better"}


def test_budgets_sit_side_by_side_per_configuration_and_render_as_the_readme_table():
    table = choosing([_report(6.2, 0.3, -0.25), _report(2.1, 0.5, -0.1)])
    assert [(r["configuration"], r["tokens_per_parameter"]) for r in table] == [
        ("dense", 2.1), ("dense", 6.2), ("ILD+DTS p_max=0.4", 2.1), ("ILD+DTS p_max=0.4", 6.2),
        ("ILD+ITS p_max=0.4", 2.1), ("ILD+ITS p_max=0.4", 6.2), ("ILD p_max=0.4", 2.1), ("ILD p_max=0.4", 6.2)]
    lines = markdown_table(table)
    assert lines[0].startswith("| configuration | P̄ | budget | seeds | FLOPs saved | loss at equal steps |")
    assert lines[2] == "| dense | 0% | 2.1 TPP | 3 | 0.0% | loss 4.000 ± 0.010 | – | – | – |"
    assert lines[5] == ("| ILD+DTS p_max=0.4 | 10% | 6.2 TPP | 2 | 10.0% | +0.30% ± 0.50 (within noise) | +0.82% | "
                        "-0.50% ± 0.25 (better) | -0.250 ± 0.030 nats at exit 6 (better) |")
    assert lines[9] == ("| ILD p_max=0.4 | 20% | 6.2 TPP | 2 | 20.0% | +1.00% ± 0.50 (within noise) | – | "
                        "-2.00% ± 0.25 (within noise) | – |")


def test_a_configuration_without_a_compute_matched_baseline_says_so():
    report = _report(6.2, 0.5, -0.1)
    report["findings"][1]["comparisons"].pop()
    [_, ild_dts, _, _] = rows(report)
    assert ild_dts["equal_flops"] is None
    assert "no compute-matched baseline yet" in markdown_table([ild_dts])[2]


def test_the_readme_table_is_the_committed_reports_table():
    """README.md's "Choosing a configuration" table is a copy of the newest report's (which carries the
    other budgets through --across): re-reporting without updating README fails here."""
    report = json.loads((ROOT / "docs" / "reproduction-6tpp" / "report.json").read_text())
    expected = markdown_table(report["choosing"])
    readme = (ROOT / "README.md").read_text().splitlines()
    section = readme[readme.index("### Choosing a configuration"):]
    start = section.index(expected[0])
    assert section[start:start + len(expected)] == expected
    # and the report's table is what its report.json documents give today
    across = json.loads((ROOT / "docs" / "reproduction" / "report.json").read_text())
    assert markdown_table(choosing([report, across])) == expected

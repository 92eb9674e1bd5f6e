"""The projection to a budget not yet trained, by hand, and the rule registered to judge it."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from eval.experiments.report.projection import (EQUAL_FLOPS, EQUAL_STEPS, judge, judged_markdown, log_line, points,
                                                power_law, project, row_label)
from eval.experiments.report.build import main
from eval.experiments.report.significance import critical_t
from tests.eval.experiments.run_folders import slices, write_run


def _p(pct, pct_se, dof):
    return {"pct": pct, "pct_se": pct_se, "dof": dof}


def test_a_line_in_log_tpp_propagates_both_budgets_errors():
    # k = 1: the target is as far beyond the large budget as the large one is beyond the small one (in ln TPP)
    fit = log_line(_p(-2.0, 0.2, 20), _p(-1.0, 0.1, 10), 1.0)
    se = math.sqrt(4 * 0.1 ** 2 + 0.2 ** 2)
    dof = se ** 4 / ((2 * 0.1) ** 4 / 10 + 0.2 ** 4 / 20)  # Welch–Satterthwaite
    assert fit["pct"] == pytest.approx(0.0) and fit["se"] == pytest.approx(se) and fit["dof"] == pytest.approx(dof)
    assert (fit["low"], fit["high"]) == pytest.approx((-critical_t(dof) * se, critical_t(dof) * se))


def test_a_power_law_halves_again_and_its_interval_is_in_log_space():
    fit = power_law(_p(-2.0, 0.2, 20), _p(-1.0, 0.1, 10), 1.0)
    assert fit["pct"] == pytest.approx(-0.5)  # halved once more
    log_se = math.sqrt(4 * (0.1 / 1.0) ** 2 + (0.2 / 2.0) ** 2)
    dof = log_se ** 4 / ((2 * 0.1) ** 4 / 10 + 0.1 ** 4 / 20)
    t = critical_t(dof)
    assert fit["log_se"] == pytest.approx(log_se)
    assert (fit["low"], fit["high"]) == pytest.approx((-0.5 * math.exp(t * log_se), -0.5 * math.exp(-t * log_se)))
    # gaps of opposite signs have no power law; a gap within its own noise of 0 has no interval
    assert power_law(_p(0.3, 0.2, 20), _p(-0.1, 0.1, 10), 1.0)["pct"] is None
    near = power_law(_p(-2.0, 0.2, 20), _p(-0.1, 0.1, 10), 1.0)
    assert near["pct"] == pytest.approx(-0.005) and near["low"] is None and "within its own 95% noise" in near["note"]


def _comparison(a, b, pct, *, se=0.04, p_value=0.5, dof=10, verdict="within noise"):
    return {"a": a, "b": b, "pct": pct, "diff": pct / 100 * 4.0, "se": se, "reference": 4.0, "dof": dof,
            "p_value": p_value, "verdict": verdict, "paired": 2, "metric": "val_loss"}


def _report(tpp, gaps, *, label_suffix=""):
    """gaps: configuration -> (equal-steps %Δ, equal-FLOPs %Δ, its p-value at equal FLOPs)."""
    configurations = [{"configuration": "dense" + label_suffix}]
    pareto = []
    for label, (steps, flops, p_value) in gaps.items():
        configurations.append({"configuration": label, "vs_dense": _comparison(label, "dense", steps)})
        pareto.append(_comparison(label, f"dense{label_suffix}, 822 steps (compute-matched)", flops, p_value=p_value))
    return {"model": {"shapes": [{"tokens_per_parameter": tpp, "runs": 4}]}, "configurations": configurations,
            "findings": [{"id": "pareto", "comparisons": pareto}],
            "noise": {"seed_std": 0.01, "seed_dof": 10, "residual_std": 0.04, "residual_dof": 10, "unstable": []}}


def test_project_reads_both_budgets_and_projects_only_what_both_share():
    small = _report(2.0, {"ILD+ITS p_max=0.8": (0.5, -2.4, 0.001), "only small": (1.0, 1.0, 0.5)})
    large = _report(6.0, {"ILD+ITS p_max=0.8": (0.6, -1.2, 0.001)})
    projection = project([("large", large), ("small", small)], 18.0)
    assert projection["k"] == pytest.approx(1.0)  # ln 18 − ln 6 = ln 6 − ln 2
    assert [b["source"] for b in projection["budgets"]] == ["small", "large"]
    assert [(r["kind"], r["configuration"]) for r in projection["rows"]] == [
        (EQUAL_STEPS, "ILD+ITS p_max=0.8"), (EQUAL_FLOPS, "ILD+ITS p_max=0.8")]
    flops = projection["rows"][1]
    assert flops["b"] == "dense, compute-matched" and flops["points"][0]["pct_se"] == pytest.approx(1.0)
    assert flops["log_line"]["pct"] == pytest.approx(0.0) and flops["power_law"]["pct"] == pytest.approx(-0.6)
    assert flops["power_law"]["exponent"] == pytest.approx(math.log(0.5) / math.log(3.0))
    assert projection["rule"]["judged"] == ["ILD+DTS p_max=0.4", "ILD+DTS p_max=0.8, r_train=1", "ILD+ITS p_max=0.8"]
    with pytest.raises(ValueError, match="needs two budgets below it"):
        project([("large", large), ("small", small)], 4.0)


def test_the_registered_rule_judges_with_holm_over_the_judged_comparisons_only():
    projection = project([("small", _report(2.0, {"ILD+DTS p_max=0.4": (0.5, -0.7, 0.01),
                                                   "ILD+ITS p_max=0.8": (0.5, -2.4, 0.001)})),
                          ("large", _report(6.0, {"ILD+DTS p_max=0.4": (0.3, -0.2, 0.2),
                                                  "ILD+ITS p_max=0.8": (0.6, -1.2, 0.001)}))], 18.0)
    projection["rule"]["judged"].append("uniform p_max=0.2")  # read from the file: a judged row never run
    # at 18 TPP: ILD+DTS 0.4 at equal FLOPs −0.5% (p 0.02), ILD+ITS −0.1% (p 0.04), r_train = 1 +0.9% (p 0.001),
    # at its own λ (the label carries it) against dense at dense's
    report = _report(18.0, {"ILD+DTS p_max=0.4": (0.2, -0.5, 0.02), "ILD+ITS p_max=0.8": (0.6, -0.1, 0.04)})
    report["configurations"].append({"configuration": "ILD+DTS p_max=0.8, r_train=1, tau_ema=0.15"})
    report["findings"][0]["comparisons"].append(_comparison("ILD+DTS p_max=0.8, r_train=1, tau_ema=0.15",
                                                            "dense, tau_ema=0.45, 822 steps (compute-matched)", 0.9,
                                                            p_value=0.001))
    judged = judge(report, projection)
    by = {v["configuration"]: v for v in judged["verdicts"]}
    # Holm over the three found: 0.001·3, 0.02·2, 0.04·1 → 0.003, 0.04, 0.04
    assert by["ILD+DTS p_max=0.8, r_train=1"]["verdict"] == "reversed"
    assert by["ILD+DTS p_max=0.4"]["p_holm"] == pytest.approx(0.04) and by["ILD+DTS p_max=0.4"]["verdict"] == "survives"
    assert by["ILD+ITS p_max=0.8"]["verdict"] == "survives"
    assert by["uniform p_max=0.2"]["verdict"] == "not measured"
    assert not any(v.get("provisional") for v in judged["verdicts"])
    assert "Provisional" not in "\n".join(judged_markdown(judged))
    # while the sweep has runs to go, a verdict is the rule's reading so far: marked, the counts named
    report["skipped_runs"] = ["ild-its-0.8,seed=1: running", "dense-steps=822,seed=1: not started"]
    early = judge(report, projection)
    assert [v["verdict"] for v in early["verdicts"]] == [v["verdict"] for v in judged["verdicts"]]
    assert [v["configuration"] for v in early["verdicts"] if v.get("provisional")] == [
        "ILD+DTS p_max=0.4", "ILD+DTS p_max=0.8, r_train=1", "ILD+ITS p_max=0.8"]  # not the unmeasured one
    page = "\n".join(judged_markdown(early))
    assert "**Provisional**: 2 of the sweep's runs are not in this report" in page
    assert "- ILD+ITS p_max=0.8 at equal FLOPs: **survives** (provisional): " in page
    del report["skipped_runs"]
    # docs/RULES.md's seeds guard: a gap within the noise after Holm whose every seed lies beyond the matched dense
    # one way by > 2 pooled σ is never "gone"; it takes that direction, and the page says why
    for comparison, p_value, beyond in zip(report["findings"][0]["comparisons"], (0.6, 0.6, 0.6),
                                           ("better", None, "worse")):  # the gaps: -0.5%, -0.1%, +0.9%
        comparison.update(p_value=p_value, seeds_beyond=beyond)
    guarded = {v["configuration"]: v for v in judge(report, projection)["verdicts"]}
    assert [(guarded[label]["verdict"], guarded[label]["seeds_guard"]) for label in
            ("ILD+DTS p_max=0.4", "ILD+ITS p_max=0.8", "ILD+DTS p_max=0.8, r_train=1")] == [
        ("survives", True), ("gone", False), ("reversed", True)]
    assert "**survives** (the seeds guard: every seed beyond the matched dense by > 2 pooled σ)" in "\n".join(
        judged_markdown({**judged, "verdicts": list(guarded.values())}))
    for comparison, p_value in zip(report["findings"][0]["comparisons"], (0.02, 0.04, 0.001)):
        comparison.update(p_value=p_value, seeds_beyond=None)
    # a gap measured on one seed a configuration has no p-value yet: shown, not judged
    report["findings"][0]["comparisons"][-1]["p_value"] = None
    unjudged = {v["configuration"]: v for v in judge(report, projection)["verdicts"]}["ILD+DTS p_max=0.8, r_train=1"]
    assert unjudged["verdict"] == "not judged yet (no seed noise)" and unjudged["point"]["pct"] == pytest.approx(0.9)
    rows = {(r["kind"], r["configuration"]): r for r in judged["rows"]}
    flops = rows[(EQUAL_FLOPS, "ILD+ITS p_max=0.8")]
    fit = next(r for r in projection["rows"] if (r["kind"], r["configuration"]) == (EQUAL_FLOPS, "ILD+ITS p_max=0.8"))
    assert flops["inside_log_line"] == (fit["log_line"]["low"] <= -0.1 <= fit["log_line"]["high"])
    assert flops["other_settings"] is False


def test_labels_lose_the_hyperparameters_a_sweep_adds_and_the_gaps_keep_them():
    assert row_label("ILD+DTS p_max=0.8, r_train=1, tau_ema=0.15") == "ILD+DTS p_max=0.8, r_train=1"
    found = points(_report(6.0, {"ILD p_max=0.4, lr=0.004": (0.1, -0.3, 0.2)}))
    assert set(found) == {(EQUAL_STEPS, "ILD p_max=0.4"), (EQUAL_FLOPS, "ILD p_max=0.4")}
    assert found[(EQUAL_FLOPS, "ILD p_max=0.4")]["same_settings"] is False


def _sweep(root: Path, steps: int, shift: float) -> None:
    """dense and ILD+DTS 0.4 (P̄ 10%) × 2 seeds, and the dense run trained to 90% of the steps."""
    for seed, mean in enumerate((3.00, 3.02)):
        write_run(root, f"dense,seed={seed}", seed, slices(mean), steps=steps)
        write_run(root, f"ild-dts-0.4,seed={seed}", seed, slices(mean + 0.01 + shift), p_max=0.4, steps=steps)
        write_run(root, f"dense-steps={steps * 9 // 10},seed={seed}", seed, slices(mean + 0.05 + shift / 2),
                  steps=steps * 9 // 10)


def test_project_then_report_the_new_budget_by_its_registered_rule(tmp_path, capsys):
    _sweep(tmp_path / "short", 100, 0.0)
    _sweep(tmp_path / "long", 300, 0.01)
    assert main([str(tmp_path / "short"), "--out", str(tmp_path / "short-report")]) == 0
    out = tmp_path / "new-budget"
    args = [str(tmp_path / "long"), "--across", str(tmp_path / "short-report"), "--out", str(out)]
    short_tpp = json.loads((tmp_path / "short-report" / "report.json").read_text())["model"]["shapes"][0][
        "tokens_per_parameter"]
    target = f"{9 * short_tpp:.6g}"  # 3× the long budget's tokens, as it is 3× the short one's
    assert main([*args, "--project", target]) == 0
    projection = json.loads((out / "projection.json").read_text())
    assert sorted(p.name for p in out.iterdir()) == ["projection.json", "projection.md"]  # no report
    assert projection["projection_command"].startswith("layerdrop report") and f"--project {target}" in \
        projection["projection_command"]
    assert projection["k"] == pytest.approx(1.0, rel=1e-4)
    assert {(r["kind"], r["configuration"]) for r in projection["rows"]} == {
        (EQUAL_STEPS, "ILD+DTS p_max=0.4"), (EQUAL_FLOPS, "ILD+DTS p_max=0.4")}
    assert "## The rule that judges the new budget (registered)" in (out / "projection.md").read_text()
    # a projection is never replaced without --overwrite; a bad budget is refused in one line
    capsys.readouterr()
    assert main([*args, "--project", target]) == 2 and "--overwrite" in capsys.readouterr().err
    with pytest.raises(SystemExit) as refused:
        main([*args, "--project", "0", "--overwrite"])
    assert refused.value.code == 2 and "--project 0.0 is invalid" in capsys.readouterr().err
    assert main([*args, "--project", f"{2 * short_tpp:.6g}", "--overwrite"]) == 2
    assert "two budgets" in capsys.readouterr().err
    # the new budget's report goes beside the projection, keeps it, and applies its rule
    _sweep(tmp_path / "new", 900, 0.02)
    assert main([str(tmp_path / "new"), "--out", str(out), "--projection", str(out / "projection.json")]) == 0
    report = json.loads((out / "report.json").read_text())
    assert json.loads((out / "projection.json").read_text()) == projection
    assert [v["configuration"] for v in report["projection"]["verdicts"]] == projection["rule"]["judged"]
    assert "## The registered projection, judged" in (out / "README.md").read_text()
    capsys.readouterr()
    assert main([str(tmp_path / "new"), "--out", str(tmp_path / "x"), "--projection", str(tmp_path / "nope.json")]) == 2
    assert "--projection" in capsys.readouterr().err and not (tmp_path / "x").exists()


def test_a_replaced_projection_stays_on_record_in_the_new_one(tmp_path):
    _sweep(tmp_path / "short", 100, 0.0)
    _sweep(tmp_path / "long", 300, 0.01)
    assert main([str(tmp_path / "short"), "--out", str(tmp_path / "short-report")]) == 0
    out = tmp_path / "new-budget"
    args = [str(tmp_path / "long"), "--across", str(tmp_path / "short-report"), "--out", str(out), "--project", "50"]
    assert main(args) == 0
    first = json.loads((out / "projection.json").read_text())
    assert main([*args, "--overwrite"]) == 0 and main([*args, "--overwrite"]) == 0
    latest = json.loads((out / "projection.json").read_text())
    assert len(latest["earlier"]) == 2 and latest["earlier"][1] == first and "earlier" not in latest["earlier"][0]
    assert "## Earlier versions of this projection (replaced, kept on record)" in (out / "projection.md").read_text()

"""Each finding at the paper's own setting, on hand-made run folders whose verdicts are known by
hand: the r_train transfer claim from a Fig. 3-style grid, comparisons at matched η, the loss
cost against the paper's own figure, Finding 6 over configurations, and Holm over the page."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import pytest

from eval.experiments.report.build import build_report, main
from eval.experiments.report.findings import holm_adjust
from tests.eval.experiments.run_folders import LAYERS, slices, write_run

# Loss vs η per (p_max, r_train), seed 0 (seed 1: 0.004 above): with r_train = 1/ρ the optimum is η
# 0.004 at every p_max; with r_train = 1 it moves to 0.002 at p_max 0.8, far beyond the seed noise.
FIG3 = {(0.0, "inverse_density"): (3.30, 3.10, 3.00, 3.20), (0.2, "inverse_density"): (3.31, 3.11, 3.01, 3.21),
        (0.4, "inverse_density"): (3.35, 3.15, 3.05, 3.25), (0.8, "inverse_density"): (3.40, 3.20, 3.10, 3.30),
        (0.4, "one"): (3.32, 3.12, 3.02, 3.22), (0.8, "one"): (3.25, 3.05, 3.08, 3.35)}
ETAS = (0.001, 0.002, 0.004, 0.008)


def fig3_sweep(root: Path, grid: dict = FIG3, seeds: tuple = (0, 1)) -> Path:
    for (p_max, r_train), losses in grid.items():
        for (eta, loss), seed in itertools.product(zip(ETAS, losses), seeds):
            write_run(root, f"p{p_max}-{r_train},lr={eta},seed={seed}", seed, slices(loss + 0.004 * seed),
                      p_max=p_max, r_train=r_train, settings={"model": {"parametrization": {"lr": eta}}})
    return root


def findings_of(report: dict) -> dict:
    return {f["id"]: f for f in report["findings"]}


def test_r_train_is_judged_by_where_the_optimum_sits_and_comparisons_match_eta(tmp_path):
    report, _ = build_report(fig3_sweep(tmp_path / "fig3"))
    found = findings_of(report)
    r_train = found["r-train"]
    assert r_train["verdict"] == "reproduced"  # 1/ρ: 0.004 at p_max 0, 0.2, 0.4, 0.8
    lr = {g["r_train"]: g for g in r_train["optima"] if g["key"] == "model.parametrization.lr"}
    assert [o["optimum"] for o in lr["inverse_density"]["optima"]] == [0.004] * 4
    assert [o["optimum"] for o in lr["one"]["optima"]] == [0.004, 0.004, 0.002]  # dense, 0.4, 0.8
    assert lr["one"]["verdict"] == "the optimum moves with p_max" and lr["inverse_density"]["grid"] == "×2"
    # the final-loss gap between 1/ρ and 1 at one η is an observation, never the verdict
    assert r_train["comparisons"] and all(c["observation"] for c in r_train["comparisons"])
    # every comparison with dense is at the same η: the headline (ILD+DTS 0.2, P̄ 5%) at each η
    headline = found["headline"]["comparisons"]
    assert sorted((c["a"], c["b"]) for c in headline) == [
        (f"ILD+DTS p_max=0.2, lr={eta}", f"dense, lr={eta}") for eta in ETAS]
    assert all(c["diff"] == pytest.approx(0.01) for c in headline)  # 0.01 above dense at every η
    rows = {r["configuration"]: r for r in report["configurations"]}
    assert rows["ILD+DTS p_max=0.8, r_train=1, lr=0.008"]["vs_dense"]["b"] == "dense, lr=0.008"
    # with r_train = 1/ρ moving too: not reproduced
    moved = {**FIG3, (0.8, "inverse_density"): (3.25, 3.05, 3.10, 3.30)}
    report, _ = build_report(fig3_sweep(tmp_path / "moved", moved))
    assert findings_of(report)["r-train"]["verdict"] == "not reproduced"
    # the same move on one seed a point places no optimum: no verdict either way
    report, _ = build_report(fig3_sweep(tmp_path / "one-seed", moved, seeds=(0,)))
    assert findings_of(report)["r-train"]["verdict"] == "undecided"


def test_without_a_fig3_grid_r_train_is_not_tested_here(tmp_path):
    root = tmp_path / "sweep"
    for seed, (a, b) in enumerate(((3.00, 3.05), (3.02, 3.06))):
        write_run(root, f"rinv,seed={seed}", seed, slices(a), p_max=0.8)
        write_run(root, f"r1,seed={seed}", seed, slices(b), p_max=0.8, r_train="one")
    r_train = findings_of(build_report(root)[0])["r-train"]
    assert r_train["verdict"] == "not tested here"
    [observation] = r_train["comparisons"]
    assert observation["observation"] and observation["diff"] == pytest.approx(-0.045)  # paired, reported only


def test_the_loss_cost_above_the_papers_own_figure_is_not_reproduced(tmp_path):
    """ILD+DTS p_max 0.8 (P̄ 20%) at +6.0% vs dense, the paper's Table 3 +2.93% at 271M."""
    root = tmp_path / "sweep"
    dense, dts = (3.00, 3.01, 3.02), (3.18, 3.19, 3.20)  # paired differences 0.18 each seed
    for seed in range(3):
        write_run(root, f"dense,seed={seed}", seed, slices(dense[seed]))
        write_run(root, f"dts,seed={seed}", seed, slices(dts[seed] + 0.001 * (seed == 1)), p_max=0.8)
    cost = findings_of(build_report(root)[0])["cost-at-equal-steps"]
    [comparison] = cost["comparisons"]
    assert comparison["paper_pct"] == pytest.approx(2.93) and comparison["paper_source"] == "Table 3, 271M"
    assert comparison["pct"] == pytest.approx(100 * (0.18 + 0.001 / 3) / 3.01)
    assert comparison["vs_paper"] == "beyond the paper's figure" and cost["verdict"] == "not reproduced"


def exits(mean: float, slope: float) -> dict:
    """Exit k's loss: mean + (L − k)·slope, so the early-exit degradation is 2·slope (L = 4)."""
    return {str(k): mean + (LAYERS - k) * slope for k in range(1, LAYERS + 1)}


def test_finding_6_takes_configurations_as_its_units(tmp_path):
    root = tmp_path / "sweep"
    slopes = {0.0: (0.5, 0.5), 0.2: (0.45, 0.2), 0.4: (0.4, 0.3), 0.8: (0.1,)}  # p_max (ILD+DTS) -> per seed
    for p_max, per_seed in slopes.items():
        for seed, slope in enumerate(per_seed):
            write_run(root, f"p{p_max},seed={seed}", seed, slices(3.0), p_max=p_max, exits=exits(3.0, slope))
    test = findings_of(build_report(root)[0])["finding-6"]["correlations"]["exit_degradation"]
    # seed means 1.0, 0.65, 0.7, 0.2 at P̄ 0, 0.05, 0.1, 0.2: ranks (4, 2, 3, 1) vs (1, 2, 3, 4),
    # Σd² = 18, ρ = 1 − 6·18/(4·15) = −0.8; of the 24 orderings, 8 reach |ρ| ≥ 0.8 (Σd² ≤ 2 or ≥ 18)
    assert test["configurations"] == 4 and test["runs"] == 7
    assert test["spearman"] == pytest.approx(-0.8) and test["p_value"] == pytest.approx(8 / 24)


def test_holm_over_every_test_on_the_page(tmp_path):
    """dense and ILD+DTS 0.2 at two seeds: the tests are the headline (also the table's row) and
    the early exits 1..3: four, adjusted by hand."""
    root = tmp_path / "sweep"
    for seed, (a, b) in enumerate(((3.00, 3.04), (3.02, 3.05))):
        write_run(root, f"dense,seed={seed}", seed, slices(a), exits=exits(a, 0.5))
        write_run(root, f"p05,seed={seed}", seed, slices(b), p_max=0.2, exits=exits(b, 0.3 + 0.01 * seed))
    out = tmp_path / "report"
    assert main([str(root), "--out", str(out)]) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["multiple_comparisons"]["tests"] == 4
    found = findings_of(report)
    tests = [found["headline"]["comparisons"][0], *found["early-exit"]["comparisons"]]
    ranked = sorted(tests, key=lambda c: c["p_value"])
    running = 0.0
    for rank, comparison in enumerate(ranked):  # Holm: (m − rank)·p, then monotone
        running = max(running, min(1.0, (4 - rank) * comparison["p_value"]))
        assert comparison["p_holm"] == pytest.approx(running)
        # beyond Holm's bar: within noise, unless every seed lies beyond by > 2σ (the seeds guard, docs/RULES.md)
        assert comparison["verdict_holm"] == (comparison["verdict"] if running < 0.05 else
                                              comparison["seeds_beyond"] or "within noise")
    row = next(r for r in report["configurations"] if r["configuration"] == "ILD+DTS p_max=0.2")
    assert row["vs_dense"]["p_holm"] == pytest.approx(tests[0]["p_holm"])  # one test, shown twice
    assert "This page makes **4 tests**" in (out / "README.md").read_text()
    assert math.isclose(report["multiple_comparisons"]["expected_by_chance"], 0.2)


def test_one_pair_paired_and_unpaired_is_two_tests_and_a_repeat_is_one():
    """The own-optimum rule compares unpaired where the table pairs (docs/lambda-6tpp/PROTOCOL.md): two
    tests of one pair; the same comparison shown twice stays one."""
    def comparison(paired: int, p_value: float) -> dict:
        return {"a": "x", "b": "dense", "metric": "val_loss", "paired": paired, "p_value": p_value, "diff": 0.1,
                "verdict": "worse"}

    table = [{"vs_dense": comparison(2, 0.01)}]
    others = [comparison(0, 0.02), comparison(2, 0.01)]
    assert holm_adjust([], table, others)["tests"] == 2
    assert [c["p_holm"] for c in (table[0]["vs_dense"], *others)] == [pytest.approx(0.02)] * 3


def test_finding_6_ranks_the_nominal_p_bar_with_ties_and_shows_the_achieved_beside(tmp_path):
    """Issue 43, item 5: three P̄ 20% schedules whose achieved P̄ differ in the fourth decimal tie at the
    nominal P̄ (average ranks); the permutation p-value is exact over the 5! orderings."""
    root = tmp_path / "sweep"
    runs = {"dense": ({}, None, 0.5), "dts-0.4": ({"p_max": 0.4}, None, 0.35),
            "dts-0.8": ({"p_max": 0.8}, 0.2003, 0.4),
            "its-0.8": ({"p_max": 0.8, "schedule": "increasing"}, 0.1998, 0.2),
            "ild-0.4": ({"p_max": 0.4, "schedule": "constant"}, 0.2001, 0.1)}
    for name, (dropout, achieved, slope) in runs.items():
        write_run(root, f"{name},seed=0", 0, slices(3.0), exits=exits(3.0, slope), **dropout)
        if achieved is not None:  # the masks' P̄, a hair off the schedule's 0.2
            summary_file = root / "runs" / f"{name},seed=0" / "summary.json"
            summary = json.loads(summary_file.read_text())
            summary_file.write_text(json.dumps({**summary, "flops_saved_pct": 100 * achieved}))
    found = findings_of(build_report(root)[0])["finding-6"]
    nominal, achieved = found["correlations"]["exit_degradation"], found["achieved_correlations"]["exit_degradation"]
    # nominal P̄ 0, .1, .2, .2, .2 → ranks 1, 2, 4, 4, 4; degradation 1.0, .7, .8, .4, .2 → ranks 5, 3, 4, 2, 1:
    # centred (−2, −1, 1, 1, 1)·(2, 0, 1, −1, −2) = −6 over √(8·10)
    assert nominal["p_bar"] == "mean_dropout_predicted" and nominal["distinct_p_bar"] == 3
    assert nominal["spearman"] == pytest.approx(-6 / math.sqrt(80))
    centred = (-2, -1, 1, 1, 1)
    extreme = sum(abs(sum(c * (r - 3) for c, r in zip(centred, order))) >= 6 - 1e-9
                  for order in itertools.permutations(range(1, 6)))
    assert nominal["p_value"] == pytest.approx(extreme / 120)
    # achieved P̄ ranks 1, 2, 5, 3, 4: Σd² = 28, ρ = 1 − 6·28/(5·24) = −0.4, shown beside, deciding nothing
    assert achieved["spearman"] == pytest.approx(-0.4) and achieved["p_bar"] == "mean_dropout_achieved"
    assert found["verdict"] == "within noise" and "p_holm" not in achieved
    scipy_stats = pytest.importorskip("scipy.stats")
    expected = scipy_stats.spearmanr([0, .1, .2, .2, .2], [1, .7, .8, .4, .2]).statistic
    assert nominal["spearman"] == pytest.approx(expected)

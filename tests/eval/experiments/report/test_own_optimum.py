"""Each configuration at its own weight decay (docs/lambda-6tpp/PROTOCOL.md), judged on hand-made run
folders whose verdicts are known by hand: a closed bracket where λ matters, an open one, and a flat
one whose optimum ties the dense λ's."""

import json
import math
from pathlib import Path

import pytest

from eval.experiments.report.build import main
from eval.experiments.report.own_optimum import carried, label_without_tau, lambda_rule, own_optimum, points_of
from eval.experiments.report.significance import t_two_sided_p
from eval.experiments.report.tables import configuration_table, group
from eval.experiments.sweep.results import load_results
from tests.eval.experiments.run_folders import slices, write_run

D = 0.005  # every cell's seeds: its mean ± D (two seeds) or mean − D, mean, mean + D (three)
ITS = {"p_max": 0.8, "schedule": "increasing"}
ILD = {"p_max": 0.4, "schedule": "constant"}
CELLS = [  # (configuration, its layer dropout, τ_EMA, mean, seeds)
    ("dense", {}, 0.15, 3.100, (0, 1)),
    ("dense", {}, 0.26, 3.000, (0, 1)),  # dense's best: closed (0.15, 0.45 have ≥ 2 seeds)
    ("dense", {}, 0.45, 3.020, (0, 1, 2)),  # the baseline (most seeds): the reference τ_EMA
    # ILD+DTS 0.8: best 0.15, closed; at dense's 0.26 it is 0.1 worse, far beyond the margin: λ matters
    ("dts", {"p_max": 0.8}, 0.087, 3.300, (0, 1)),
    ("dts", {"p_max": 0.8}, 0.15, 3.100, (0, 1, 2)),
    ("dts", {"p_max": 0.8}, 0.26, 3.200, (0, 1)),
    ("dts", {"p_max": 0.8}, 0.45, 3.250, (0, 1)),
    # ILD+ITS 0.8: best 0.26 on one seed, 0.15 never run: open
    ("its", ITS, 0.26, 3.050, (0,)),
    ("its", ITS, 0.45, 3.080, (0, 1)),
    # ILD 0.4: best 0.15, closed, but 0.26 (dense's optimum) and 0.45 tie it: λ does not matter
    ("ild", ILD, 0.087, 3.090, (0, 1)),
    ("ild", ILD, 0.15, 3.050, (0, 1)),
    ("ild", ILD, 0.26, 3.052, (0, 1)),
    ("ild", ILD, 0.45, 3.053, (0, 1)),
    ("ild", ILD, 0.78, 3.070, (0, 1)),
]
# σ by hand: each of the 13 cells with ≥ 2 seeds adds (n − 1)s² = 2D²; 11 cells of 2 seeds and 2 of 3: 15 dof
SIGMA = math.sqrt(13 * 2 * D ** 2 / 15)


def seed_values(mean: float, seeds: tuple[int, ...]) -> dict[int, float]:
    offsets = {1: (0.0,), 2: (-D, D), 3: (-D, 0.0, D)}[len(seeds)]
    return {seed: mean + offset for seed, offset in zip(seeds, offsets)}


@pytest.fixture()
def sweep(tmp_path) -> Path:
    root = tmp_path / "sweep"
    for name, dropout, tau, mean, seeds in CELLS:
        for seed, value in seed_values(mean, seeds).items():
            write_run(root, f"{name}-tau-{tau},seed={seed}", seed, slices(value),
                      settings={"model": {"parametrization": {"tau_ema": tau}}}, **dropout)
    return root


def section_of(root: Path) -> dict:
    results, _ = load_results(root)
    configurations = group(results)
    table, _ = configuration_table(configurations)
    return own_optimum(configurations, table)


def by_label(section: dict) -> dict[str, dict]:
    return {entry["configuration"]: entry for entry in section["configurations"]}


def test_each_configuration_gets_its_points_best_point_and_bracket(sweep):
    section = section_of(sweep)
    assert section["grid"] == [0.087, 0.15, 0.26, 0.45, 0.78]
    assert section["reference_tau_ema"] == 0.45 and section["seed_dof"] == 15
    assert section["seed_std"] == pytest.approx(SIGMA)
    found = by_label(section)
    assert list(found) == ["dense", "ILD+DTS p_max=0.8", "ILD p_max=0.4", "ILD+ITS p_max=0.8"]  # dense first
    dense = found["dense"]
    assert dense["best"] == 0.26 and dense["closed"]
    assert [(p["tau_ema"], p["seeds"]) for p in dense["points"]] == [(0.15, 2), (0.26, 2), (0.45, 3)]
    assert dense["points"][2]["per_seed"] == {"0": pytest.approx(3.015), "1": pytest.approx(3.020),
                                              "2": pytest.approx(3.025)}
    # 0.45 is 0.02 from the best, beyond 2σ·√(1/3 + 1/2) ≈ 0.0120: not tied
    assert dense["points"][2]["margin"] == pytest.approx(2 * SIGMA * math.sqrt(1 / 3 + 1 / 2))
    assert not dense["points"][2]["tied"]
    assert found["ILD+DTS p_max=0.8"]["best"] == 0.15 and found["ILD+DTS p_max=0.8"]["closed"]
    its = found["ILD+ITS p_max=0.8"]
    assert its["best"] == 0.26 and not its["closed"]
    assert its["why"] == "fewer than 2 seeds at τ_EMA 0.26 (1), 0.15 (not run)"
    ild = found["ILD p_max=0.4"]
    assert ild["best"] == 0.15 and ild["closed"]
    ties = {p["tau_ema"]: p["tied"] for p in ild["points"]}
    assert ties == {0.087: False, 0.15: False, 0.26: True, 0.45: True, 0.78: False}  # 0.002, 0.003 < 2σ < 0.02


def test_lambda_matters_only_for_a_closed_optimum_beyond_the_margin(sweep):
    found = by_label(section_of(sweep))
    dts = found["ILD+DTS p_max=0.8"]["lambda"]
    assert dts["verdict"] == "matters" and dts["at"] == 0.26 and dts["seeds"] == [2, 3]
    assert dts["gap"] == pytest.approx(0.1) and dts["margin"] == pytest.approx(2 * SIGMA * math.sqrt(1 / 2 + 1 / 3))
    assert found["ILD+ITS p_max=0.8"]["lambda"]["verdict"] == "open"
    ild = found["ILD p_max=0.4"]["lambda"]
    assert ild["verdict"] == "does not matter" and ild["gap"] == pytest.approx(0.002)
    assert found["dense"]["lambda"] is None


def test_what_carries_to_the_next_budget(sweep):
    found = by_label(section_of(sweep))
    carries = {label: entry["carries"]["tau_ema"] for label, entry in found.items()}
    # its own optimum where λ matters; else the dense λ (the reference), an open bracket included
    assert carries == {"dense": 0.45, "ILD+DTS p_max=0.8": 0.15, "ILD+ITS p_max=0.8": 0.45, "ILD p_max=0.4": 0.45}
    assert found["dense"]["carries"]["why"] == "dense's λ, carried unchanged; its own optimum here is τ_EMA 0.26"
    assert found["ILD+ITS p_max=0.8"]["carries"]["why"] == "open bracket: the dense λ"


def test_the_comparison_at_each_ones_own_optimum_beside_the_same_lambda(sweep):
    found = by_label(section_of(sweep))
    # ILD+DTS 0.8 at 0.15 (seeds 0-2) vs dense at 0.26 (seeds 0, 1): not the same seeds, so unpaired
    # (docs/RULES.md alone would pair the two shared ones): SE = σ·√(1/3 + 1/2), the slices' error 0
    own = found["ILD+DTS p_max=0.8"]["at_own_optimum"]
    assert (own["a"], own["b"]) == ("ILD+DTS p_max=0.8, tau_ema=0.15", "dense, tau_ema=0.26")
    se = SIGMA * math.sqrt(1 / 3 + 1 / 2)
    assert own["paired"] == 0 and own["diff"] == pytest.approx(0.1) and own["se"] == pytest.approx(se)
    assert own["dof"] == 15 and own["p_value"] == pytest.approx(t_two_sided_p(0.1 / se, 15))
    assert own["verdict"] == "worse" and found["ILD+DTS p_max=0.8"]["dense_best"] == 0.26
    same = found["ILD+DTS p_max=0.8"]["same_lambda"]  # the table's: both at 0.45, paired over seeds 0, 1
    assert (same["a"], same["b"], same["paired"]) == ("ILD+DTS p_max=0.8, tau_ema=0.45", "dense, tau_ema=0.45", 2)
    assert same["diff"] == pytest.approx(((3.245 - 3.015) + (3.255 - 3.020)) / 2)  # the per-seed differences
    # ILD 0.4 at 0.15 and dense at 0.26 have the very same seeds: paired
    assert found["ILD p_max=0.4"]["at_own_optimum"]["paired"] == 2
    assert found["ILD p_max=0.4"]["at_own_optimum"]["diff"] == pytest.approx(0.05)
    assert found["ILD+ITS p_max=0.8"]["at_own_optimum"] is None  # open: no optimum to compare at


def test_the_report_shows_the_section_and_holds_its_tests_in_holm(sweep, tmp_path):
    out = tmp_path / "report"
    assert main([str(sweep), "--out", str(out)]) == 0
    report = json.loads((out / "report.json").read_text())
    own = by_label(report["own_optimum"])["ILD+DTS p_max=0.8"]["at_own_optimum"]
    assert own["p_holm"] >= own["p_value"] and own["verdict_holm"] == "worse"
    text = (out / "README.md").read_text()
    assert "## Each configuration at its own weight decay" in text
    assert "| ILD p_max=0.4 | 3.0900 ± 0.0071 (2) | **3.0500 ± 0.0071 (2)** | = 3.0520 ± 0.0071 (2) |" in text
    assert "the optimum moves" in text and "λ does not matter within the noise" in text
    assert "| ILD+DTS p_max=0.8 | 0.15 | its own optimum: λ matters |" in text
    assert "| ILD+ITS p_max=0.8 | – (its bracket is open) |" in text
    # Fig. 3's reading of the same points judges with the same noise and the same brackets
    families = {f["family"]: f for f in report["hyperparameters"]["figure3"]}
    assert all(f["sigma"] == report["own_optimum"]["seed_std"] == pytest.approx(SIGMA) for f in families.values())
    dts, its = families["schedule=decreasing"]["optima"], families["schedule=increasing"]["optima"]
    assert [o["p_max"] for o in dts] == [0.0, 0.8] and dts[1]["position"].startswith("moves (+0.1000")
    assert its[1]["position"].startswith("undecided: its bracket is open")


def test_a_sweep_at_one_tau_has_no_such_section(tmp_path):
    root = tmp_path / "sweep"
    for seed in (0, 1):
        write_run(root, f"dense,seed={seed}", seed, slices(3.0 + seed * 0.01))
        write_run(root, f"ild,seed={seed}", seed, slices(3.1 + seed * 0.01), p_max=0.4)
    assert section_of(root) is None
    out = tmp_path / "report"
    assert main([str(root), "--out", str(out)]) == 0
    assert "own_optimum" not in json.loads((out / "report.json").read_text())
    assert "own weight decay" not in (out / "README.md").read_text()


def test_a_dense_only_tau_sweep_is_a_tuning_not_this_section(tmp_path):
    root = tmp_path / "sweep"
    for tau, seed in ((0.15, 0), (0.26, 0), (0.26, 1), (0.45, 0)):
        write_run(root, f"dense-tau-{tau},seed={seed}", seed, slices(3.0 + tau / 10 + seed * 0.01),
                  settings={"model": {"parametrization": {"tau_ema": tau}}})
    assert section_of(root) is None


def test_a_closed_configuration_says_nothing_while_dense_is_open():
    closed = {"closed": True, "best": 0.26, "points": []}
    assert lambda_rule(closed, {"closed": False, "best": 0.45}, 0.01)["verdict"] == "open"
    assert lambda_rule(closed, None, 0.01)["verdict"] == "not tested"
    assert lambda_rule(closed, {"closed": True, "best": 0.26}, 0.01)["verdict"] == "does not matter"
    assert lambda_rule(closed, {"closed": True, "best": 0.45}, None)["verdict"] == "not tested"


def test_labels_and_groups_leave_tau_out(sweep):
    assert label_without_tau("ILD+DTS p_max=0.4 + early-exit loss 0.5 (rotational 3, uniform), tau_ema=0.26") == \
        "ILD+DTS p_max=0.4 + early-exit loss 0.5 (rotational 3, uniform)"
    results, _ = load_results(sweep)
    groups = points_of(group(results))
    assert [sorted(g.cells) for g in groups] == [[0.15, 0.26, 0.45], [0.087, 0.15, 0.26, 0.45],
                                                 [0.087, 0.15, 0.26, 0.45, 0.78], [0.26, 0.45]]
    dense = groups[0]
    assert carried(dense, None, {"closed": False, "best": 0.26}, None, 0.45)["why"] == "dense's λ, carried unchanged"

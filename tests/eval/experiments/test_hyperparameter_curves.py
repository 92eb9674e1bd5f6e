"""Loss vs η/σ/τ per series with seed bands, the µTransfer drift table, Fig. 3's verdict and
the rising-validation flag, recomputed from run records."""

from __future__ import annotations

import math
import statistics
from pathlib import Path

import pytest

from eval.experiments.hyperparameter_curves import (base_shape_of, curves, curves_figure, figure3, hyperparameter_report,
                                                    rising_validation, transfer_table, transfer_verdicts)
from eval.experiments.sweep_results import RunResult, label_configurations


def run(loss: float, *, seed: int = 0, lr: float = 0.01, std: float = 0.02, d: int = 64, layers: int = 12,
        kind: str = "complete_p", p_max: float = 0.0, r_train: str = "inverse_density", tau: float = 0.6,
        curve: list[float] | None = None, base: tuple[int, int] = (64, 12)) -> RunResult:
    config = {"seed_everything": seed,
              "model": {"decoder": {"d_model": d, "n_layers": layers, "init_std": std},
                        "layer_dropout": {"p_max": p_max, "r_train": r_train},
                        "parametrization": {"kind": kind, "lr": lr, "tau_ema": tau, "d_base": base[0],
                                            "n_layers_base": base[1]}}}
    name = f"lr={lr},std={std},d={d},L={layers},kind={kind},p={p_max},r={r_train},tau={tau},seed={seed}"
    losses = curve or [loss + 1, loss + 0.5, loss + 0.1]
    return RunResult(name=name, folder=Path("/nonexistent"), config=config, summary={"val_loss": loss + 0.05},
                     status={}, evals={"heldout": {"loss": loss, "groups": {}}}, seed=seed,
                     curve={"step": [100, 200, 300][:len(losses)], "val_loss": losses})


def test_loss_vs_lr_has_a_point_per_value_with_the_mean_and_band_over_seeds():
    losses = {(0.001, 0): 5.0, (0.001, 1): 5.2, (0.01, 0): 4.5, (0.01, 1): 4.7, (0.1, 0): 6.0}
    results = [run(v, lr=lr, seed=s) for (lr, s), v in losses.items()]
    found = curves(results, "model.parametrization.lr")
    assert len(found) == 1
    (curve,) = found
    assert [p["value"] for p in curve["points"]] == [0.001, 0.01, 0.1]
    assert curve["points"][0]["mean"] == pytest.approx(5.1) and curve["points"][0]["std"] == pytest.approx(
        statistics.stdev([5.0, 5.2]))
    assert (curve["points"][1]["min"], curve["points"][1]["max"]) == (4.5, 4.7)
    assert curve["points"][2]["std"] is None and curve["points"][2]["seeds"] == 1
    assert curve["optimum"] == 0.01 and curve["optimum_index"] == 1 and not curve["at_edge"]
    figure = curves_figure(found, "model.parametrization.lr")
    assert figure.axes[0].get_xscale() == "log"


def test_a_tuning_folder_gives_one_curve_per_stage_through_the_best_point():
    # stage 1: lr at std 0.02; stage 2: std at lr 0.01 (the shared point is one run)
    results = [run(5.0, lr=0.001), run(4.5, lr=0.01), run(4.8, lr=0.1), run(4.4, lr=0.01, std=0.05),
               run(4.9, lr=0.01, std=0.1)]
    lr_curves = curves(results, "model.parametrization.lr")
    std_curves = curves(results, "model.decoder.init_std")
    assert [c["label"] for c in lr_curves] == ["init_std=0.02"]  # σ = 0.05 has one lr only: no curve
    assert [c["label"] for c in std_curves] == ["lr=0.01"]
    assert std_curves[0]["optimum"] == 0.05
    report = hyperparameter_report(results)
    assert set(report["curves"]) == {"model.parametrization.lr", "model.decoder.init_std"}
    assert report["transfer"] is None and report["figure3"] is None


def test_mu_transfer_table_gives_each_shapes_optimum_and_its_drift_per_parametrization():
    grid = [0.001, 0.002, 0.004, 0.008]
    # complete_p: optimum 0.004 at every width; standard: it halves per doubling of width
    optimum = {("complete_p", 64): 0.004, ("complete_p", 128): 0.004, ("complete_p", 256): 0.004,
               ("standard", 64): 0.008, ("standard", 128): 0.004, ("standard", 256): 0.002}
    results = [run(4.0 + abs(math.log2(lr / best)), lr=lr, d=d, kind=kind)
               for (kind, d), best in optimum.items() for lr in grid]
    table = transfer_table(curves(results, "model.parametrization.lr"))
    by = {(r["parametrization"], r["d_model"]): r for r in table}
    for (kind, d), best in optimum.items():
        assert by[(kind, d)]["optimal_lr"] == best
    assert [by[("standard", d)]["drift_log2"] for d in (64, 128, 256)] == [0.0, -1.0, -2.0]
    assert {by[("complete_p", d)]["drift_log2"] for d in (64, 128, 256)} == {0.0}
    verdicts = {v["parametrization"]: v for v in transfer_verdicts(table)}
    assert verdicts["complete_p"]["verdict"] == "optimum stays put"
    assert verdicts["standard"]["verdict"].startswith("optimum moves") and verdicts["standard"]["max_drift_log2"] == 2
    assert verdicts["standard"]["edge"]  # d = 64's optimum, 0.008, is the grid's largest value


def test_mu_transfer_drift_and_regret_are_measured_from_the_parametrizations_base_shape():
    grid = [0.001, 0.002, 0.004, 0.008]
    # the base (d 64, L 12) has its optimum at 0.004; d 32 at 0.008 (0.03 better than at 0.004);
    # d 128 at 0.004; L 24 at 0.002, where 0.004 is 0.1 worse
    loss = {(32, 12): {0.001: 4.6, 0.002: 4.4, 0.004: 4.33, 0.008: 4.3},
            (64, 12): {0.001: 4.5, 0.002: 4.3, 0.004: 4.2, 0.008: 4.4},
            (128, 12): {0.001: 4.4, 0.002: 4.2, 0.004: 4.1, 0.008: 4.3},
            (64, 24): {0.001: 4.3, 0.002: 4.0, 0.004: 4.1, 0.008: 4.5}}
    results = [run(v, lr=lr, d=d, layers=L) for (d, L), by_lr in loss.items() for lr, v in by_lr.items()]
    assert base_shape_of(results) == (64, 12)
    report = hyperparameter_report(results)
    by = {(r["d_model"], r["n_layers"]): r for r in report["transfer"]}
    assert by[(64, 12)]["reference"] and not by[(32, 12)]["reference"]
    assert {k: r["drift_log2"] for k, r in by.items()} == {(32, 12): 1.0, (64, 12): 0.0, (128, 12): 0.0,
                                                           (64, 24): -1.0}
    assert by[(32, 12)]["transferred_lr"] == 0.004 and by[(32, 12)]["regret"] == pytest.approx(0.03)
    assert by[(64, 24)]["regret"] == pytest.approx(0.1) and by[(128, 12)]["regret"] == 0.0
    (verdict,) = report["transfer_verdicts"]
    assert verdict["max_drift_log2"] == 1.0 and verdict["max_regret"] == pytest.approx(0.1)
    assert verdict["verdict"] == "optimum moves (up to 2^1×); the reference's η costs up to 0.1000 nats"
    # runs naming different bases: no base shape, the smallest shape is the reference
    results[0].config["model"]["parametrization"]["d_base"] = 32
    assert base_shape_of(results) is None
    assert hyperparameter_report(results)["transfer"][0]["reference"]  # d 32, L 12: the smallest


def test_figure3_verdict_holds_when_the_optimum_index_is_the_same_for_every_p_max():
    grid = [0.002, 0.004, 0.008]
    best = {("inverse_density", 0.0): 0.004, ("inverse_density", 0.4): 0.004, ("inverse_density", 0.8): 0.004,
            ("one", 0.0): 0.004, ("one", 0.4): 0.008, ("one", 0.8): 0.008}
    results = [run(4.0 + abs(math.log2(lr / b)) + p, lr=lr, p_max=p, r_train=r)
               for (r, p), b in best.items() for lr in grid]
    found = {f["r_train"]: f for f in figure3({"model.parametrization.lr": curves(results,
                                                                                  "model.parametrization.lr")})}
    assert found["inverse_density"]["verdict"] == "the optimum stays put across p_max"
    assert [o["optimum"] for o in found["inverse_density"]["optima"]] == [0.004] * 3
    assert found["one"]["verdict"] == "the optimum moves with p_max"
    assert [o["p_max"] for o in found["one"]["optima"]] == [0.0, 0.4, 0.8]


def test_runs_whose_validation_loss_rose_are_flagged_with_where():
    steady, spiky = run(4.0, lr=0.001), run(4.0, lr=0.1, curve=[5.0, 5.3, 4.9])
    flat = run(4.0, lr=0.01, curve=[5.0, 4.5, 4.5005])  # within float noise: not flagged
    label_configurations([steady, spiky, flat])
    flagged = rising_validation([steady, spiky, flat])
    assert [f["run"] for f in flagged] == [spiky.name]
    assert flagged[0]["rises"] == [{"from_step": 100, "to_step": 200, "from": 5.0, "to": 5.3}]


def test_a_setting_older_runs_lack_does_not_split_a_series():
    # runs adopted from an earlier version's report lack settings added since (here
    # model.decoder.family); they still share a curve with the new runs that set it
    old = [run(5.0, lr=0.001), run(4.5, lr=0.01)]
    new = [run(4.8, lr=0.1)]
    new[0].config["model"]["decoder"]["family"] = "celerity"
    (curve,) = curves(old + new, "model.parametrization.lr")
    assert curve["label"] == "all runs" and [p["value"] for p in curve["points"]] == [0.001, 0.01, 0.1]

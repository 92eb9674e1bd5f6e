"""Loss vs η/σ/τ per series with seed bands, the µTransfer drift table, Fig. 3's verdict and
the rising-validation flag, recomputed from run records."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import pytest
import yaml

from eval.experiments.report.hyperparameter_curves import (base_shape_of, curves, curves_figure, figure3,
                                                           hyperparameter_report, rising_validation, transfer_table,
                                                           transfer_verdicts)
from eval.experiments.report.build import main as report_main
from eval.experiments.sweep.runner import main as sweep_main
from eval.experiments.sweep.results import RunResult, label_configurations

LR, TAU = "model.parametrization.lr", "model.parametrization.tau_ema"


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
    assert verdict["parametrization"] == "complete_p"  # every run's, though the sweep does not vary it
    assert verdict["max_drift_log2"] == 1.0 and verdict["max_regret"] == pytest.approx(0.1)
    assert verdict["verdict"] == "optimum moves (up to 2^1×); the reference's η costs up to 0.1000 nats"
    # runs naming different bases: no base shape, the smallest shape is the reference
    results[0].config["model"]["parametrization"]["d_base"] = 32
    assert base_shape_of(results) is None
    assert hyperparameter_report(results)["transfer"][0]["reference"]  # d 32, L 12: the smallest


def fig3_curves(best: dict, seeds=(0, 1), spread: float = 0.01, key: str = "model.parametrization.lr",
                grid=(0.002, 0.004, 0.008, 0.016), depth: float = 1.0, **settings) -> list[dict]:
    """Loss vs η per (r_train, p_max): ``depth`` nats per factor of 2 from its best η, seeds ±spread/2."""
    results = [run(4.0 + depth * abs(math.log2(lr / b)) + p + (s - 0.5) * spread, lr=lr, p_max=p, r_train=r, seed=s,
                   **settings)
               for (r, p), b in best.items() for lr in grid for s in seeds]
    return curves(results, key)


def test_figure3_stays_put_when_every_p_max_has_the_dense_optimum_and_moves_beyond_the_seed_noise():
    best = {("inverse_density", 0.0): 0.004, ("inverse_density", 0.4): 0.004, ("inverse_density", 0.8): 0.004,
            ("one", 0.0): 0.004, ("one", 0.4): 0.008, ("one", 0.8): 0.008}
    found = {f["r_train"]: f for f in figure3({LR: fig3_curves(best)})}
    assert found["inverse_density"]["verdict"] == "the optimum stays put across p_max"
    assert [o["optimum"] for o in found["inverse_density"]["optima"]] == [0.004] * 3
    assert [o["position"] for o in found["inverse_density"]["optima"]] == ["reference", "same", "same"]
    assert found["one"]["verdict"] == "the optimum moves with p_max"
    assert [o["p_max"] for o in found["one"]["optima"]] == [0.0, 0.4, 0.8]
    assert found["one"]["optima"][1]["position"].startswith("moves (+1.0000 at the dense optimum")
    assert found["one"]["sigma"] == pytest.approx(statistics.stdev([0.0, 0.01]))


def test_figure3_places_an_optimum_only_in_a_closed_bracket_and_ties_within_the_noise():
    moved = {("inverse_density", 0.0): 0.004, ("inverse_density", 0.8): 0.008}
    # one seed at every point: neither a different grid point nor the same one decides anything
    (one_seed,) = figure3({LR: fig3_curves(moved, seeds=(0,))})
    assert one_seed["verdict"] == "undecided" and one_seed["sigma"] is None
    assert one_seed["optima"][1]["position"] == ("undecided: the dense curve's bracket is open (fewer than 2 "
                                                 "seeds at 0.002 (1), 0.004 (1), 0.008 (1))")
    (same,) = figure3({LR: fig3_curves({("inverse_density", 0.0): 0.004, ("inverse_density", 0.8): 0.004},
                                       seeds=(0,))})
    assert same["verdict"] == "undecided"
    # two seeds, but the curve is flat against its noise: 0.008 is best, 0.004 within 2σ·√(1/2 + 1/2)
    (flat,) = figure3({LR: fig3_curves(moved, spread=0.05, depth=0.01)})
    assert flat["verdict"] == "the optimum stays put across p_max within the noise"
    assert flat["optima"][1]["position"] == "tied (+0.0100 at the dense optimum, within 0.0707)"
    # a best point at the grid's edge may still move past a point not run
    (edge,) = figure3({LR: fig3_curves(moved, spread=0.05, depth=0.01, grid=(0.002, 0.004, 0.008))})
    assert edge["verdict"] == "undecided" and edge["optima"][1]["position"] == \
        "undecided: its bracket is open (best, 0.008, is at the grid's edge)"
    # a neighbour of one seed leaves the bracket open, however far the optimum moved
    results = [run(4.0 + abs(math.log2(lr / 0.008)), lr=lr, p_max=0.8, seed=s)
               for lr in (0.004, 0.008, 0.016) for s in ((0, 1) if lr < 0.016 else (0,))]
    results += [run(4.0 + abs(math.log2(lr / 0.004)) + s / 100, lr=lr, seed=s)
                for lr in (0.002, 0.004, 0.008, 0.016) for s in (0, 1)]
    (short,) = figure3({LR: curves(results, LR)})
    assert short["optima"][1]["position"] == "undecided: its bracket is open (fewer than 2 seeds at 0.016 (1))"
    # the dense optimum not run on the curve
    results = [run(4.0 + abs(math.log2(lr / 0.016)), lr=lr, p_max=0.8, seed=s)
               for lr in (0.008, 0.016, 0.032) for s in (0, 1)]
    results += [run(4.0 + abs(math.log2(lr / 0.004)) + s / 100, lr=lr, seed=s)
                for lr in (0.002, 0.004, 0.008, 0.016, 0.032) for s in (0, 1)]
    (missing,) = figure3({LR: curves(results, LR)})
    assert missing["optima"][1]["position"] == "undecided: not run at the dense optimum 0.004"


def test_figure3_takes_each_schedule_as_its_own_family_against_the_one_dense_curve():
    results = [run(4.0 + abs(math.log2(tau / 0.26)) + (s - 0.5) * 0.01, tau=tau, seed=s)
               for tau in (0.15, 0.26, 0.45) for s in (0, 1)]  # dense: best 0.26
    for schedule, best in (("decreasing", 0.26), ("increasing", 0.45)):
        for tau in (0.15, 0.26, 0.45, 0.78):
            for s in (0, 1):
                r = run(4.1 + abs(math.log2(tau / best)) + (s - 0.5) * 0.01, tau=tau, seed=s, p_max=0.8)
                r.config["model"]["layer_dropout"]["schedule"] = schedule
                results.append(r)
    for r in results[:6]:
        r.config["model"]["layer_dropout"]["schedule"] = "decreasing"  # the default a dense config carries
    found = {f["family"]: f for f in figure3({TAU: curves(results, TAU)})}
    assert set(found) == {"schedule=decreasing", "schedule=increasing"}  # never one group across schedules
    assert found["schedule=decreasing"]["verdict"] == "the optimum stays put across p_max"
    assert found["schedule=increasing"]["verdict"] == "the optimum moves with p_max"
    assert [o["p_max"] for o in found["schedule=increasing"]["optima"]] == [0.0, 0.8]  # dense is its reference too


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


# ----------------------------------------------------------------- end to end
TINY = Path(__file__).resolve().parents[4] / "recipes" / "tiny.yaml"


def sweep_file(folder: Path, data: Path, name: str, runs: dict) -> Path:
    """A test-sized sweep (as tests/eval/experiments/sweep/test_tune.py's) with the named runs."""
    spec = {"base": str(TINY), "data": {"dir": str(data)},
            "overrides": {"model.decoder.vocab_size": 300, "model.decoder.d_model": 32, "model.decoder.n_layers": 2,
                          "model.decoder.n_heads": 1, "model.decoder.max_seq_len": 32,
                          "model.parametrization.d_base": 32, "model.parametrization.n_layers_base": 2,
                          "model.lr_schedule": {"warmup_steps": 0, "warmup_fraction": 0.1},
                          "data.seq_len": 32, "data.batch_size": 4, "data.val_batches": 2,
                          "trainer.max_steps": 12, "trainer.val_check_interval": 6, "trainer.limit_val_batches": 2,
                          "trainer.log_every_n_steps": 4, "checkpoint.every_n_steps": 6},
            "seeds": [0], "seed_keys": ["seed_everything", "model.layer_dropout.seed"],
            "evals": [{"name": "heldout", "command": "eval heldout",
                       "args": {"max-tokens": 1024, "groups": 2, "batch-size": 4}}],
            "runs": runs}
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def heldout(root: Path) -> dict[str, float]:
    return {p.name.removesuffix(",seed=0"): json.loads((p / "evals" / "heldout.json").read_text())["loss"]
            for p in (root / "runs").iterdir()}


@pytest.mark.slow  # two real sweeps: ~2.5 minutes on 2 cores
def test_a_real_transfer_sweep_and_a_real_figure3_sweep_report_their_optima(tmp_path, prepared_tokens):
    """Both checks end to end on test-sized runs: `layerdrop sweep`, then `layerdrop report`,
    whose optima, drifts, regrets and verdicts are recomputed here from the runs' own
    held-out evaluations."""
    lrs = [0.003, 0.03]
    transfer = {f"{shape},lr={lr}": {"model.decoder.d_model": d, "model.decoder.n_heads": d // 32, LR: lr,
                                     "model.layer_dropout.p_max": 0.0}
                for shape, d in (("base", 32), ("d64", 64)) for lr in lrs}
    figure = {f"{name},lr={lr}": {"model.layer_dropout": {"p_max": p, "r_train": r}, LR: lr}
              for name, p, r in (("dense", 0.0, "inverse_density"), ("p0.5-rinv", 0.5, "inverse_density"),
                                 ("p0.5-r1", 0.5, "one")) for lr in lrs}
    outcome = {}
    for name, runs in (("transfer", transfer), ("fig3", figure)):
        root = tmp_path / name
        assert sweep_main([str(sweep_file(tmp_path, prepared_tokens, name, runs)), "--out", str(root),
                           "--jobs", "2", "--threads-per-job", "1"]) == 0
        assert report_main([str(root), "--out", str(tmp_path / f"{name}-report")]) == 0
        outcome[name] = (heldout(root), json.loads((tmp_path / f"{name}-report" / "report.json").read_text()),
                         (tmp_path / f"{name}-report" / "README.md").read_text())

    loss, report, readme = outcome["transfer"]
    rows = {r["d_model"]: r for r in report["hyperparameters"]["transfer"]}
    best = {shape: min(lrs, key=lambda lr: loss[f"{shape},lr={lr}"]) for shape in ("base", "d64")}
    assert rows[32]["reference"] and rows[32]["optimal_lr"] == best["base"]
    assert rows[64]["optimal_lr"] == best["d64"]
    assert rows[64]["drift_log2"] == pytest.approx(math.log2(best["d64"] / best["base"]))
    assert rows[64]["regret"] == pytest.approx(loss[f"d64,lr={best['base']}"] - loss[f"d64,lr={best['d64']}"])
    (verdict,) = report["hyperparameters"]["transfer_verdicts"]
    assert verdict["parametrization"] == "complete_p"
    assert verdict["verdict"].startswith("optimum stays put" if best["base"] == best["d64"] else "optimum moves")
    assert readme.startswith("# The µTransfer check") and "## µTransfer: the optimal η_base per shape" in readme
    assert (tmp_path / "transfer-report" / "images" / "loss_vs_lr.png").is_file()

    loss, report, readme = outcome["fig3"]
    found = {f["r_train"]: f for f in report["hyperparameters"]["figure3"] if f["key"] == LR}
    best = {name: min(lrs, key=lambda lr: loss[f"{name},lr={lr}"]) for name in ("dense", "p0.5-rinv", "p0.5-r1")}
    # p_max 0 runs once (r_train has no effect without dropout): it is each r_train's p_max-0 point
    for r_train, name in (("inverse_density", "p0.5-rinv"), ("one", "p0.5-r1")):
        assert [(o["p_max"], o["optimum"]) for o in found[r_train]["optima"]] == [(0.0, best["dense"]),
                                                                                 (0.5, best[name])]
        # one seed on a two-point grid: every optimum sits at an edge of an open bracket, so nothing is placed
        assert found[r_train]["verdict"] == "undecided"
        assert found[r_train]["optima"][1]["position"].startswith("undecided: the dense curve's bracket is open")
    assert readme.startswith("# Fig. 3") and "## Fig. 3: does the optimum stay put across p_max?" in readme

"""layerdrop tune: stages planned from run folders, the choice by mean loss over seeds,
the confirmation seeds, adoption of a grid already run, and a real tuning end to end."""

from __future__ import annotations

import json
import math
import statistics
import sys
from pathlib import Path

import pytest
import yaml

from eval.experiments.report.build import main as report_main
from eval.experiments.sweep.runner import main as sweep_main
from eval.experiments.sweep.spec import SweepError
from eval.experiments.sweep.tune import load_tune, main
from tests.helpers.refusals import hashes, refused

REPO = Path(__file__).resolve().parents[4]
TINY = REPO / "recipes" / "tiny.yaml"
LR, STD, TAU = "model.parametrization.lr", "model.decoder.init_std", "model.parametrization.tau_ema"


def tune_file(folder: Path, data: Path, **tune) -> Path:
    spec = {
        "base": str(TINY),
        "data": {"dir": str(data)},
        "overrides": {"model.decoder.vocab_size": 300, "model.decoder.d_model": 32, "model.decoder.n_layers": 2,
                      "model.decoder.n_heads": 2, "model.decoder.max_seq_len": 32,
                      "model.parametrization.d_base": 32, "model.parametrization.n_layers_base": 2,
                      "model.layer_dropout.p_max": 0.0,
                      "model.lr_schedule": {"warmup_steps": 0, "warmup_fraction": 0.1},
                      "data.seq_len": 32, "data.batch_size": 4, "data.val_batches": 2,
                      "trainer.max_steps": 12, "trainer.val_check_interval": 6, "trainer.limit_val_batches": 2,
                      "trainer.log_every_n_steps": 4, "checkpoint.every_n_steps": 6},
        "seeds": [0],
        "seed_keys": ["seed_everything", "model.layer_dropout.seed"],
        "evals": [{"name": "heldout", "command": "eval heldout",
                   "args": {"max-tokens": 1024, "groups": 2, "batch-size": 4}}],
        "tune": {"metric": "heldout", "search": {LR: [0.001, 0.01, 0.1], STD: [0.02, 0.05], TAU: [0.3, 0.6]},
                 "start": {STD: 0.02, TAU: 0.6}, "confirm": {"seeds": [1], "along": LR, "neighbours": 1}, **tune},
    }
    path = folder / "tune.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def fake_loss(lr: float, std: float, tau: float, seed: int) -> float:
    """A bowl with its minimum at lr = 0.01, std = 0.05, tau = 0.3, plus seed noise."""
    return 4.0 + (math.log10(lr) + 2) ** 2 + (std - 0.05) ** 2 * 100 + (tau - 0.3) ** 2 + 0.01 * seed


def finish(root: Path, name: str, loss: float) -> None:
    """A run folder as `layerdrop sweep` leaves a finished run (the files tune reads)."""
    run = root / "runs" / name
    (run / "evals").mkdir(parents=True)
    (run / "summary.json").write_text(json.dumps({"val_loss": loss + 0.1}))
    (run / "evals" / "heldout.json").write_text(json.dumps({"loss": loss}))


def finish_every_planned_run(root: Path, tune: Path, capsys) -> list[str]:
    """Dry-run, finish what it lists as next, repeat: the runs in the order tune asks."""
    asked = []
    while True:
        assert main([str(tune), "--out", str(root), "--dry-run"]) == 0
        lines = [line.strip() for line in capsys.readouterr().out.splitlines()]
        pending = [line.split(": ")[0] for line in lines if "seed=" in line and line.endswith(": pending")]
        if not pending:
            return asked
        for name in pending:
            values = dict(part.split("=") for part in name.split(","))
            finish(root, name, fake_loss(float(values["lr"]), float(values["init_std"]), float(values["tau_ema"]),
                                         int(values["seed"])))
            asked.append(name)


def test_stages_go_through_the_best_point_so_far_and_confirm_with_seeds(tmp_path, capsys):
    data = tmp_path / "data"
    data.mkdir()
    (data / "manifest.json").write_text("{}")
    tune, root = tune_file(tmp_path, data), tmp_path / "out"
    asked = finish_every_planned_run(root, tune, capsys)
    assert asked == [
        # stage 1: lr at the start point
        "lr=0.001,init_std=0.02,tau_ema=0.6,seed=0", "lr=0.01,init_std=0.02,tau_ema=0.6,seed=0",
        "lr=0.1,init_std=0.02,tau_ema=0.6,seed=0",
        # stage 2: init_std at lr = 0.01 (0.02 is stage 1's run: one folder)
        "lr=0.01,init_std=0.05,tau_ema=0.6,seed=0",
        # stage 3: tau_ema at lr = 0.01, init_std = 0.05
        "lr=0.01,init_std=0.05,tau_ema=0.3,seed=0",
        # confirm: seed 1 (and seed 0 where missing) at the optimum and its two lr neighbours
        "lr=0.001,init_std=0.05,tau_ema=0.3,seed=0", "lr=0.001,init_std=0.05,tau_ema=0.3,seed=1",
        "lr=0.01,init_std=0.05,tau_ema=0.3,seed=1",
        "lr=0.1,init_std=0.05,tau_ema=0.3,seed=0", "lr=0.1,init_std=0.05,tau_ema=0.3,seed=1"]
    assert main([str(tune), "--out", str(root)]) == 0  # nothing left to run: writes the result
    result = json.loads((root / "tune.json").read_text())
    assert result["finished"] and result["chosen"] == {LR: 0.01, STD: 0.05, TAU: 0.3}
    confirm = result["stages"][-1]
    for point in confirm["points"]:  # the means, recomputed from the run folders
        reports = [root / "runs" / f"{point['run']},seed={s}" / "evals" / "heldout.json" for s in (0, 1)]
        losses = [json.loads(path.read_text())["loss"] for path in reports]
        assert point["mean"] == pytest.approx(statistics.fmean(losses))
    recipe_text = (root / "tuned.yaml").read_text()
    recipe = yaml.safe_load(recipe_text)
    assert recipe["model"]["parametrization"]["lr"] == 0.01
    assert recipe["model"]["decoder"]["init_std"] == 0.05 and recipe["model"]["parametrization"]["tau_ema"] == 0.3
    assert recipe["model"]["decoder"]["d_model"] == 32 and recipe["trainer"]["max_steps"] == 12  # the shared ones
    assert recipe["trainer"]["default_root_dir"] == "runs/tiny"  # the base's: no run folder of the tuning
    assert recipe["data"]["data_dir"] == str(data)  # the tune file's data.dir
    assert recipe_text.startswith("# tuned base: tune.yaml") and f"layerdrop tune {tune}" in recipe_text
    assert "<- chosen" in recipe_text and "chosen: model.parametrization.lr = 0.01" in recipe_text


def test_a_diverged_run_is_the_worst_point_not_an_error(tmp_path, capsys):
    data = tmp_path / "data"
    data.mkdir()
    (data / "manifest.json").write_text("{}")
    tune, root = tune_file(tmp_path, data, search={LR: [0.001, 0.01]}, start={}, confirm=None), tmp_path / "out"
    finish(root, "lr=0.001,seed=0", 5.0)
    run = root / "runs" / "lr=0.01,seed=0"
    (run / "logs").mkdir(parents=True)
    (run / "status.json").write_text(json.dumps({"state": "failed", "failed_stage": "pretrain"}))
    (run / "logs" / "pretrain.log").write_text("NonFiniteLossError: 5 steps in a row were skipped for non-finite "
                                               "values, the limit of guard.max_consecutive_nonfinite\n")
    assert main([str(tune), "--out", str(root)]) == 0
    out = capsys.readouterr().out
    assert "diverged" in out
    assert json.loads((root / "tune.json").read_text())["chosen"] == {LR: 0.001}


@pytest.mark.parametrize("change, message", [
    ({"search": {}}, "tune.search={} is invalid"),
    ({"search": {LR: [0.1, 0.1]}}, "distinct values"),
    ({"start": {}}, "tune.start lacks"),
    ({"metric": "skip"}, "tune.metric='skip' is invalid"),
    ({"confirm": {"seeds": [0]}}, "not among the sweep's seeds"),
    ({"confirm": {"seeds": [1], "along": "trainer.max_steps"}}, "tune.confirm.along"),
    ({"bogus": 1}, "tune keys ['bogus'] are invalid"),
])
def test_bad_tune_files_fail_with_one_line(tmp_path, capsys, change, message):
    data = tmp_path / "data"
    data.mkdir()
    tune = tune_file(tmp_path, data, **change)
    assert main([str(tune), "--out", str(tmp_path / "out"), "--dry-run"]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert not (tmp_path / "out").exists()
    with pytest.raises(SweepError):
        load_tune(tune)


def test_an_unknown_recipe_key_is_refused_in_one_line_before_anything_is_written(tmp_path):
    """Once caught only by a `pretrain --print_config` per run, after the folders existed."""
    data = tmp_path / "data"
    data.mkdir()
    tune = tune_file(tmp_path, data, search={"model.parametrization.lrr": [0.001, 0.01], STD: [0.02]},
                     start={STD: 0.02}, confirm={"seeds": [1], "along": "model.parametrization.lrr"})
    before = hashes(tmp_path)
    line = refused("tune", str(tune), "--out", str(tmp_path / "out"), "--dry-run")
    assert "tune.search key 'model.parametrization.lrr' is not a recipe key " \
           "(did you mean 'model.parametrization.lr'?)" in line
    assert hashes(tmp_path) == before and not (tmp_path / "out").exists()
    spec = yaml.safe_load(tune_file(tmp_path, data).read_text())
    spec["overrides"]["trainer.max_stepz"] = 12  # the shared parts too
    tune.write_text(yaml.safe_dump(spec, sort_keys=False))
    with pytest.raises(SweepError, match="overrides key 'trainer.max_stepz' is not a recipe key"):
        load_tune(tune)


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_tune_adopts_a_grid_already_run_and_finishes_for_real(tmp_path, prepared_tokens, capsys):
    """Stage 1 run first as a plain `layerdrop sweep` grid (the folder names tune would
    give), then `layerdrop tune` adopts those runs and trains only the rest."""
    tune = tune_file(tmp_path, Path(prepared_tokens), search={LR: [0.003, 0.03], STD: [0.02, 0.05]},
                     start={STD: 0.02}, confirm=None)  # the confirmation's planning: the test above
    spec = yaml.safe_load(tune.read_text())
    grid = {k: v for k, v in spec.items() if k != "tune"}
    grid["grid"] = {LR: [0.003, 0.03], STD: [0.02]}
    (tmp_path / "grid.yaml").write_text(yaml.safe_dump(grid, sort_keys=False))
    root = tmp_path / "out"
    assert sweep_main([str(tmp_path / "grid.yaml"), "--out", str(root), "--jobs", "2", "--threads-per-job", "1"]) == 0
    adopted = {p.name: (p / "summary.json").stat().st_mtime_ns for p in (root / "runs").iterdir()}
    assert sorted(adopted) == ["lr=0.003,init_std=0.02,seed=0", "lr=0.03,init_std=0.02,seed=0"]
    capsys.readouterr()
    assert main([str(tune), "--out", str(root), "--jobs", "2", "--threads-per-job", "1"]) == 0
    for name, mtime in adopted.items():  # not re-run
        assert (root / "runs" / name / "summary.json").stat().st_mtime_ns == mtime
    loss = {p.name: json.loads((p / "evals" / "heldout.json").read_text())["loss"] for p in (root / "runs").iterdir()}
    lr = min((0.003, 0.03), key=lambda v: loss[f"lr={v},init_std=0.02,seed=0"])
    std = min((0.02, 0.05), key=lambda v: loss[f"lr={lr},init_std={v},seed=0"])
    assert set(loss) == set(adopted) | {f"lr={lr},init_std=0.05,seed=0"}
    result = json.loads((root / "tune.json").read_text())
    assert result["chosen"] == {LR: lr, STD: std}
    recipe = yaml.safe_load((root / "tuned.yaml").read_text())
    assert recipe["model"]["parametrization"]["lr"] == lr and recipe["model"]["decoder"]["init_std"] == std
    assert "layerdrop tune" in json.loads((root / "machine.json").read_text())["commands"][-1]

    # The report of the tuning folder: loss vs lr and vs init_std, from the runs' own evaluations.
    assert report_main([str(root), "--out", str(tmp_path / "report")]) == 0
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    curves = report["hyperparameters"]["curves"]
    (lr_curve,) = curves[LR]
    assert [(p["value"], p["mean"]) for p in lr_curve["points"]] == [
        (v, loss[f"lr={v},init_std=0.02,seed=0"]) for v in (0.003, 0.03)]
    (std_curve,) = curves[STD]
    assert std_curve["optimum"] == std and std_curve["label"] == f"lr={lr}"
    assert (tmp_path / "report" / "images" / "loss_vs_lr.png").is_file()
    readme = (tmp_path / "report" / "README.md").read_text()
    assert "## Loss vs η" in readme and readme.startswith("# Tuning the base\n")
    assert "None is tested: the sweep has no configurations a finding can be checked on." in readme
    # Continued elsewhere from the committed report: every run adopted, none trained, the same choice.
    capsys.readouterr()
    other = tmp_path / "elsewhere"
    assert main([str(tune), "--out", str(other), "--done-from", str(tmp_path / "report")]) == 0
    assert "adopted" in capsys.readouterr().out
    assert not any((p / "logs").exists() for p in (other / "runs").iterdir())
    assert json.loads((other / "tune.json").read_text())["chosen"] == {LR: lr, STD: std}


def test_dry_run_plans_on_from_runs_finished_in_a_done_from_folder(tmp_path, capsys):
    data = tmp_path / "data"
    data.mkdir()
    (data / "manifest.json").write_text("{}")
    tune, committed = tune_file(tmp_path, data), tmp_path / "committed"
    for lr in (0.001, 0.01, 0.1):
        finish(committed, f"lr={lr},init_std=0.02,tau_ema=0.6,seed=0", fake_loss(lr, 0.02, 0.6, 0))
    out = tmp_path / "out"
    assert main([str(tune), "--out", str(out), "--dry-run", "--done-from", str(committed)]) == 0
    text = capsys.readouterr().out
    assert "stage 2: init_std (lr=0.01, tau_ema=0.6)" in text  # stage 1 decided from the committed runs
    assert "lr=0.01,init_std=0.05,tau_ema=0.6,seed=0: pending" in text
    assert not out.exists()


def coupled_loss(lr: float, std: float, tau: float, seed: int) -> float:
    """A valley whose best lr grows with std (0.001 below std 0.035, 0.01 above): one pass
    from std 0.02 picks lr 0.001, then std 0.05, where lr 0.01 is better: a second pass moves."""
    best_lr = -3 if std < 0.035 else -2
    return 4.0 + (math.log10(lr) - best_lr) ** 2 + (std - 0.05) ** 2 * 2000 + (tau - 0.3) ** 2 + 0.01 * seed


@pytest.mark.parametrize("passes", [1, 2, 3])
def test_more_passes_follow_keys_that_interact_and_stop_once_nothing_moves(tmp_path, capsys, monkeypatch, passes):
    data = tmp_path / "data"
    data.mkdir()
    (data / "manifest.json").write_text("{}")
    tune, root = tune_file(tmp_path, data, passes=passes), tmp_path / "out"
    monkeypatch.setattr(sys.modules[__name__], "fake_loss", coupled_loss)
    asked = finish_every_planned_run(root, tune, capsys)
    assert len(asked) == len(set(asked))  # a point two passes share is run once
    assert main([str(tune), "--out", str(root)]) == 0
    result = json.loads((root / "tune.json").read_text())
    titles = [stage["title"].split(":")[0] for stage in result["stages"]]
    if passes == 1:
        # one pass chose lr 0.001 at std 0.02; only the confirmation's neighbour shows 0.01 is better at 0.05
        assert titles == ["stage 1", "stage 2", "stage 3", "confirm"] and result["stages"][0]["chosen"][LR] == 0.001
        assert result["stages"][2]["chosen"][LR] == 0.001 and result["chosen"][LR] == 0.01
    else:  # pass 2 moves lr to 0.01; pass 3 (where allowed) moves nothing, so no pass 4 would run
        assert titles == ["pass 1, stage 1", "pass 1, stage 2", "pass 1, stage 3", "pass 2, stage 1",
                          "pass 2, stage 2", "pass 2, stage 3", *(["pass 3, stage 1", "pass 3, stage 2",
                                                                   "pass 3, stage 3"] if passes == 3 else []),
                          "confirm"]
        assert result["chosen"] == {LR: 0.01, STD: 0.05, TAU: 0.3} and result["finished"]


def test_passes_must_be_a_positive_integer(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    with pytest.raises(SweepError, match=r"tune.passes=0 is invalid: expected an integer >= 1"):
        load_tune(tune_file(tmp_path, data, passes=0), data_dir=str(data))

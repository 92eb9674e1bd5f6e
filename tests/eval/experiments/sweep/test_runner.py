"""layerdrop sweep: the sweep file, run names and configs, predictions, SLURM, and a real
sweep end to end (stopped, resumed, a failed run, idempotent, then its report)."""

import json
import math
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest
import yaml

from eval.experiments.report.build import main as report_main
from eval.experiments.sweep.run_folder import RunFolder
from eval.experiments.sweep.runner import LAUNCH_SCRIPT, Runner, cli_args, main
from eval.experiments.sweep.spec import SweepError, load_sweep, predict, run_recipe, short_keys
from framework.config import LayerDropoutConfig
from framework.schedules import mean_dropout
from tests.helpers.refusals import hashes, refused

REPO = Path(__file__).resolve().parents[4]
TINY = REPO / "recipes" / "tiny.yaml"


EVALS = [{"name": "heldout", "command": "eval heldout", "args": {"max-tokens": 2048, "groups": 4, "batch-size": 4}},
         {"name": "skip", "command": "eval skip", "args": {"sets": ["none"], "sweep": ["single"], "max-tokens": 1024}}]


def sweep_file(folder: Path, data: Path, **extra) -> Path:
    spec = {
        "base": str(TINY),
        "data": {"dir": str(data)},
        "overrides": {
            "model.decoder.vocab_size": 300, "model.decoder.d_model": 32, "model.decoder.n_layers": 4,
            "model.decoder.n_heads": 2, "model.decoder.max_seq_len": 32,
            "model.lr_schedule": {"warmup_steps": 0, "warmup_fraction": 0.1},
            "data.seq_len": 32, "data.batch_size": 4, "data.val_batches": 2,
            "trainer.max_steps": 24, "trainer.val_check_interval": 8, "trainer.limit_val_batches": 2,
            "trainer.log_every_n_steps": 4, "checkpoint.every_n_steps": 4,
        },
        "grid": {"model.layer_dropout.p_max": [0.0, 0.5]},
        # data.seq_len beyond max_seq_len: pretrain refuses it, after the config is written
        "runs": {"broken": {"data.seq_len": 64, "seeds": [0]}},
        "seeds": [0, 1],
        "evals": EVALS,
        **extra,
    }
    path = folder / "sweep.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    """~100k tokens of real code (stdlib json + email) with a 300-token BPE."""
    from data_prep.prepare import main as prepare

    stdlib = sysconfig.get_paths()["stdlib"]
    corpus = tmp_path_factory.mktemp("corpus")
    for package in ("json", "email"):
        for name in sorted(os.listdir(os.path.join(stdlib, package))):
            if name.endswith(".py"):
                shutil.copy(os.path.join(stdlib, package, name), corpus / f"{package}_{name}")
    out = tmp_path_factory.mktemp("prepared") / "data"
    assert prepare(["--files", str(corpus), "--out", str(out), "--vocab-size", "300", "--val-fraction", "0.2",
                    "--chunk-tokens", "8192", "--workers", "1", "--no-progress"]) == 0
    return out


# ------------------------------------------------------------------- the sweep file
def test_runs_are_named_from_their_overrides_and_seeds(tmp_path, data):
    sweep = load_sweep(sweep_file(tmp_path, data, grid={"model.layer_dropout.p_max": [0.0, 0.5],
                                                         "model.layer_dropout.schedule": ["constant"]}))
    names = [r.name for r in sweep.runs]
    assert names == ["p_max=0.0,schedule=constant,seed=0", "p_max=0.0,schedule=constant,seed=1",
                     "p_max=0.5,schedule=constant,seed=0", "p_max=0.5,schedule=constant,seed=1", "broken,seed=0"]
    assert short_keys(["model.decoder.d_model", "data.seq_len", "model.seq_len"]) == {
        "model.decoder.d_model": "d_model", "data.seq_len": "data.seq_len", "model.seq_len": "model.seq_len"}


def test_a_run_recipe_is_the_base_with_overrides_seeds_folder_and_data(tmp_path, data):
    sweep = load_sweep(sweep_file(tmp_path, data))
    run = sweep.runs[3]  # p_max=0.5, seed 1
    recipe = run_recipe(sweep, run, tmp_path / "runs" / run.name)
    base = yaml.safe_load(TINY.read_text())
    assert recipe["model"]["layer_dropout"] == {**base["model"]["layer_dropout"], "p_max": 0.5, "seed": 1}
    assert recipe["seed_everything"] == recipe["data"]["seed"] == 1
    assert recipe["model"]["decoder"]["attention"] == base["model"]["decoder"]["attention"]  # kept, not replaced
    assert recipe["model"]["lr_schedule"] == {"warmup_steps": 0, "warmup_fraction": 0.1}
    assert recipe["trainer"]["default_root_dir"] == str(tmp_path / "runs" / run.name)
    assert recipe["data"]["data_dir"] == str(data)


@pytest.mark.parametrize("change, message", [
    ({"grid": {"trainer.max_steps": []}}, "non-empty list"),
    ({"seeds": [0, 0]}, "distinct integers"),
    ({"runs": {"p_max=0.0": {}}}, "appear twice"),
    ({"runs": {"bad name/": {}}}, "run name"),
    ({"evals": [{"name": "x"}]}, "name and command"),
    ({"base": "no/such.yaml"}, "does not exist"),
    ({"gird": {}}, "allowed: base"),
])
def test_bad_sweep_files_fail_with_one_line(tmp_path, data, change, message):
    with pytest.raises(SweepError, match=message):
        load_sweep(sweep_file(tmp_path, data, **change))


def test_a_sweep_file_or_base_whose_yaml_aliases_expand_too_far_is_one_line(tmp_path, data):
    """Issue 46: a "billion laughs" in a grid value ran `sweep --dry-run` out of memory (a
    MemoryError traceback); the file is refused before anything walks it."""
    from tests.helpers.hostile_files import billion_laughs

    laughs = "{" + billion_laughs().replace("\n", ", ") + "}"
    sweep = sweep_file(tmp_path, data)
    sweep.write_text(sweep.read_text().replace("- 0.5", f"- {laughs}"))
    with pytest.raises(ValueError, match=rf"^sweep file {re.escape(repr(str(sweep)))} is refused: its YAML aliases"):
        load_sweep(sweep)
    base = tmp_path / "base.yaml"
    base.write_text(TINY.read_text() + "laughs:\n" + "".join(f"  {line}\n" for line in billion_laughs().splitlines()))
    with pytest.raises(ValueError, match=rf"^base recipe {re.escape(repr(str(base)))} is refused: its YAML aliases"):
        load_sweep(sweep_file(tmp_path, data, base=str(base)))


def test_predictions_follow_the_schedule_and_flop_accounting(tmp_path, data):
    sweep = load_sweep(sweep_file(tmp_path, data))
    dense, dropout = (predict(run_recipe(sweep, r, tmp_path)) for r in (sweep.runs[0], sweep.runs[2]))
    assert dense.mean_dropout == 0 and dense.training_flops == dense.dense_training_flops
    expected = mean_dropout(LayerDropoutConfig(p_max=0.5), 4, 24)
    assert dropout.mean_dropout == pytest.approx(expected) == pytest.approx(0.125)
    blocks = dense.dense_training_flops - (dense.dense_training_flops - dropout.dense_training_flops)
    assert dropout.training_flops < blocks
    assert dropout.tokens == 24 * 4 * 32 and dense.non_embedding_params > 0


def test_eval_arguments_become_command_words():
    words = cli_args({"max-tokens": 5, "sweep": ["middle", "single"], "adaptive": True, "skip": False,
                      "out_dir": "{run_dir}/a"}, {"run_dir": "R", "ckpt": "C", "data": "D"})
    assert words == ["--max-tokens", "5", "--sweep", "middle", "single", "--adaptive", "--out-dir", "R/a"]


def test_dry_run_lists_runs_with_predictions_and_writes_nothing(tmp_path, data, capsys):
    out = tmp_path / "out"
    assert main([str(sweep_file(tmp_path, data)), "--out", str(out), "--dry-run", "--flops-per-second", "1e9"]) == 0
    text = capsys.readouterr().out
    assert "p_max=0.5,seed=1" in text and "0.1250" in text and "5 runs, predicted training compute" in text
    assert re.search(r"= [0-9.]+ (seconds|minutes|hours) at 1.00e9 FLOP/s", text) and "pending" in text
    assert not out.exists()


def test_bad_overrides_stop_before_anything_is_written(tmp_path, data, capsys):
    path = sweep_file(tmp_path, data, runs={"x": {"model.layer_dropout.p_max": 1.5}})
    assert main([str(path), "--out", str(tmp_path / "out")]) == 2
    assert "p_max=1.5 is invalid" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


# -------------------------------------------------------------------------- SLURM
def test_slurm_writes_one_array_task_per_run_through_the_launch_script(tmp_path, data, capsys):
    out = tmp_path / "out"
    assert main([str(sweep_file(tmp_path, data)), "--out", str(out), "--slurm", "--jobs", "3",
                 "--slurm-nodes", "2", "--slurm-gpus-per-node", "4", "--threads-per-job", "6"]) == 0
    runs = (out / "slurm" / "runs.txt").read_text().split()
    assert runs == [r.name for r in load_sweep(out / "sweep.yaml", data_dir=str(data)).runs]
    script = (out / "slurm" / "array.sbatch").read_text()
    for line in ("#SBATCH --nodes=2", "#SBATCH --gpus-per-node=4", "#SBATCH --ntasks-per-node=4",
                 'RUN=$(sed -n "$((SLURM_ARRAY_TASK_ID + 1))p"', "--launcher slurm-task", '--only "$RUN"',
                 "--threads-per-job 6", f"cd {Path.cwd().resolve()}"):
        assert line in script
    assert subprocess.run(["bash", "-n", str(out / "slurm" / "array.sbatch")]).returncode == 0
    assert f"sbatch --array=0-4%3 {out / 'slurm' / 'array.sbatch'}" in capsys.readouterr().out
    # an array task trains through recipes/launch/slurm.sbatch, with the run's strategy
    sweep = load_sweep(out / "sweep.yaml", data_dir=str(data))
    folder = RunFolder(out, sweep.runs[0])
    folder.dir.mkdir(parents=True)
    folder.config.write_text("trainer:\n  strategy: ddp\n")
    argv, env = Runner(sweep, out, threads=6, launcher="slurm-task").train_argv(folder)
    assert argv == ["bash", str(LAUNCH_SCRIPT), str(folder.config)] and LAUNCH_SCRIPT.is_file()
    assert env["STRATEGY"] == "ddp" and env["OMP_NUM_THREADS"] == "6"
    assert "--resume auto" in LAUNCH_SCRIPT.read_text()


# ------------------------------------------------------------------- end to end
def _sweep_command(path: Path, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "framework.cli", "sweep", str(path), "--out", str(out), "--jobs", "2",
            "--threads-per-job", "1", *extra]


def _status(out: Path, run: str) -> dict:
    return json.loads((out / "runs" / run / "status.json").read_text())


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(1800)  # ~1 min on an idle 2-core machine; many subprocesses when it is shared
def test_a_sweep_stops_resumes_reports_a_failed_run_and_is_idempotent(tmp_path, data):
    # one evaluation (the report's skip and speculative forms are tested on hand-made runs)
    path, out = sweep_file(tmp_path, data, evals=EVALS[:1]), tmp_path / "out"
    grid = ["p_max=0.0,seed=0", "p_max=0.0,seed=1", "p_max=0.5,seed=0", "p_max=0.5,seed=1"]
    # 1. stop the sweep (SIGTERM, as a scheduler or a person would) once a run has a checkpoint
    sweep = subprocess.Popen(_sweep_command(path, out), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             start_new_session=True, text=True)
    deadline = time.monotonic() + 240
    while not list(out.glob("runs/*/checkpoints/step-*.ckpt")):
        assert sweep.poll() is None and time.monotonic() < deadline, sweep.stdout.read() if sweep.poll() else ""
        time.sleep(0.05)
    sweep.send_signal(signal.SIGTERM)
    assert sweep.wait(timeout=120) == 128 + signal.SIGTERM
    # runs stopped with a step checkpoint (a checkpoints/ folder alone may hold just the tokenizer)
    stopped = [r for r in grid if (out / "runs" / r / "status.json").is_file()
               and _status(out, r)["state"] == "stopped" and list((out / "runs" / r).glob("checkpoints/step-*.ckpt"))]
    assert stopped, sweep.stdout.read()
    assert not any((out / "runs" / r / "summary.json").exists() for r in stopped)
    assert all(_status(out, r)["state"] != "failed" for r in grid if (out / "runs" / r / "status.json").is_file())

    # 2. run it again: the stopped run resumes, the others run, the broken one fails alone
    second = subprocess.run(_sweep_command(path, out), capture_output=True, text=True, timeout=1500)
    assert second.returncode == 1, second.stdout + second.stderr
    # refused by its config stage: `pretrain --print_config` checks seq_len against the model before training
    assert "broken,seed=0 (config)" in second.stderr and "seq_len=64" in second.stderr
    assert _status(out, "broken,seed=0")["state"] == "failed"
    for run in grid:
        folder = out / "runs" / run
        assert json.loads((folder / "summary.json").read_text())["steps"] == 24
        assert (folder / "evals" / "heldout.json").is_file()
        config = yaml.safe_load((folder / "config.yaml").read_text())  # the resolved config
        assert config["seed_everything"] == int(run[-1]) and config["trainer"]["max_steps"] == 24
        assert config["model"]["layer_dropout"]["p_max"] == float(run.split(",")[0].split("=")[1])
        assert _status(out, run)["state"] == "done"
    for run in stopped:
        log = (out / "runs" / run / "logs" / "pretrain.log").read_text()
        assert "resume: continuing from" in log
        assert _status(out, run)["stages"]["pretrain"]["attempts"] == 2

    # 3. once more: nothing left to do for the finished runs
    before = {r: _status(out, r)["stages"] for r in grid}
    third = subprocess.run(_sweep_command(path, out, "--only", "p_max=*"), capture_output=True, text=True,
                           timeout=300)
    assert third.returncode == 0 and "4 done, 0 to run" in third.stdout
    assert {r: _status(out, r)["stages"] for r in grid} == before

    # 4. the report's numbers, recomputed here from the run folders
    report_dir = tmp_path / "report"
    assert report_main([str(out), "--out", str(report_dir)]) == 0
    report = json.loads((report_dir / "report.json").read_text())
    assert any(s.startswith("broken,seed=0: failed") for s in report["skipped_runs"])
    rows = {row["configuration"]: row for row in report["configurations"]}
    assert set(rows) == {"dense", "ILD+DTS p_max=0.5"}
    for label, prefix in (("dense", "p_max=0.0"), ("ILD+DTS p_max=0.5", "p_max=0.5")):
        folders = [out / "runs" / f"{prefix},seed={s}" for s in (0, 1)]
        losses = [json.loads((f / "evals" / "heldout.json").read_text())["loss"] for f in folders]
        summaries = [json.loads((f / "summary.json").read_text()) for f in folders]
        assert rows[label]["val_loss_mean"] == pytest.approx(statistics.fmean(losses), rel=1e-12)
        assert rows[label]["val_loss_std"] == pytest.approx(statistics.stdev(losses), rel=1e-9)
        assert rows[label]["mean_dropout_achieved"] == pytest.approx(
            statistics.fmean(s["flops_saved_pct"] / 100 for s in summaries))
        assert rows[label]["training_flops"] == pytest.approx(statistics.fmean(s["training_flops"] for s in summaries))
    dense = rows["dense"]["val_loss_per_seed"]
    dropout = rows["ILD+DTS p_max=0.5"]["val_loss_per_seed"]
    vs = rows["ILD+DTS p_max=0.5"]["vs_dense"]
    assert vs["diff"] == pytest.approx(statistics.fmean(dropout) - statistics.fmean(dense), rel=1e-9)
    sigma = math.sqrt((statistics.variance(dense) + statistics.variance(dropout)) / 2)
    assert report["noise"]["seed_std"] == pytest.approx(sigma, rel=1e-9)
    # paired over seeds 0 and 1: the mean per-seed difference; 2 configurations × 2 seeds leave one
    # residual degree of freedom, σ = |d_0 − d_1|/2, and a t test on 1 dof (Cauchy: p = 1 − 2/π·atan|t|)
    d = [a - b for a, b in zip(dropout, dense)]
    assert vs["paired"] == 2 and vs["dof"] == 1 and vs["se"] == pytest.approx(abs(d[0] - d[1]) / 2, rel=1e-9)
    p_value = 1 - 2 / math.pi * math.atan(abs(vs["diff"]) / vs["se"])
    assert vs["p_value"] == pytest.approx(p_value, rel=1e-9)
    assert vs["verdict"] == ("within noise" if p_value >= 0.05 else "better" if vs["diff"] < 0 else "worse")
    assert (report_dir / "README.md").read_text().count("p_max=0.5,seed=") == 2
    assert {"pareto", "exits", "degradation", "heatmaps"} <= set(report["images"])
    # the committed copy alone rebuilds the same numbers
    again = tmp_path / "again"
    assert report_main([str(report_dir), "--out", str(again)]) == 0
    rebuilt = json.loads((again / "report.json").read_text())
    assert rebuilt["configurations"] == report["configurations"]
    assert rebuilt["findings"] == report["findings"]
    assert not list(report_dir.glob("runs/*/checkpoints"))


def test_a_value_the_recipe_does_not_accept_fails_that_run_at_its_config(tmp_path, data):
    """Keys are checked up front (below); values by `pretrain --print_config`, per run."""
    sweep = load_sweep(sweep_file(tmp_path, data, runs={"typo": {"data.seq_len": "long"}}))
    run = next(r for r in sweep.runs if r.name == "typo,seed=0")
    folder = RunFolder(tmp_path / "out", run)
    error = Runner(sweep, tmp_path / "out", threads=1).write_config(folder)
    assert error.startswith("invalid recipe: ") and "data.seq_len" in error
    assert folder.recipe.is_file() and not folder.config.exists()
    assert not list(folder.dir.glob(".*partial*"))


def test_a_moved_sweep_folder_resumes_with_its_paths_rewritten_and_a_changed_one_is_refused(tmp_path, data):
    sweep = load_sweep(sweep_file(tmp_path, data))
    run = next(r for r in sweep.runs if r.name == "p_max=0.5,seed=0")
    assert Runner(sweep, tmp_path / "first", threads=1).write_config(RunFolder(tmp_path / "first", run)) is None
    shutil.move(tmp_path / "first", tmp_path / "moved")
    folder = RunFolder(tmp_path / "moved", run)
    assert Runner(sweep, tmp_path / "moved", threads=1).write_config(folder) is None
    for written in (folder.recipe, folder.config):
        assert str(tmp_path / "first") not in written.read_text()
        assert yaml.safe_load(written.read_text())["trainer"]["default_root_dir"] == str(folder.dir.resolve())
    changed = load_sweep(sweep_file(tmp_path, data, overrides={**yaml.safe_load((tmp_path / "sweep.yaml").read_text())
                                                                ["overrides"], "trainer.max_steps": 25}))
    folder = RunFolder(tmp_path / "moved", next(r for r in changed.runs if r.name == run.name))
    error = Runner(changed, tmp_path / "moved", threads=1).write_config(folder)
    assert error.startswith(f"{folder.recipe} holds a different recipe")


def test_predictions_count_the_early_exit_heads():
    """Each early-exit head a step (on average over the curriculum) is one more head on every token."""
    from framework.config import ModelConfig
    from framework.flops import dense_step_flops

    recipe = {"model": {"decoder": {"vocab_size": 256, "d_model": 32, "n_layers": 4, "n_heads": 2},
                        "layer_dropout": {"p_max": 0.0}},
              "trainer": {"max_steps": 10}, "data": {"seq_len": 16, "batch_size": 2}}
    plain = predict(recipe)
    recipe["model"]["early_exit_loss"] = {"scale": 0.5, "curriculum": "rotational"}  # exits 1..3: 2, 1, 2, 1, ...
    with_exits = predict(recipe)
    head = dense_step_flops(ModelConfig(vocab_size=256, d_model=32, n_layers=4, n_heads=2), 2, 16).head
    assert with_exits.training_flops == pytest.approx(plain.training_flops + 10 * 1.5 * head)
    # against a plain dense run (the same tokens, one head) the exit heads are a cost, shown as a negative saving
    assert with_exits.dense_total_flops == pytest.approx(plain.training_flops)
    assert with_exits.flops_saved_pct == pytest.approx(-100 * 10 * 1.5 * head / plain.training_flops)


def test_the_reproductions_dense_runs_are_the_tuned_base(tmp_path, monkeypatch):
    """recipes/sweeps/paper-cpu.yaml trains recipes/cpu-base.yaml unchanged: its dense seed 0 is
    the very run `layerdrop tune` chose (docs/tuning's copy), up to the machine's folders, and
    every configuration differs from dense by its layer dropout alone, but the compute-matched
    dense runs, which differ by their length alone."""
    from eval.experiments.sweep.adoption import MACHINE_PATHS

    monkeypatch.chdir(REPO)
    paper = load_sweep(REPO / "recipes" / "sweeps" / "paper-cpu.yaml", data_dir=str(tmp_path))
    runs = {run.name: run for run in paper.runs if not run.matches}
    assert {name for name in runs if name.endswith("seed=2")} == {"dense,seed=2", "ild-dts-0.2,seed=2",
                                                                  "ild-dts-0.4,seed=2", "ild-dts-0.8,seed=2"}
    for run in (r for r in paper.runs if r.matches):  # trained to the ILD+DTS runs' FLOPs
        recipe = run_recipe(paper, run, tmp_path / run.name)
        reference = run_recipe(paper, runs[f"dense,seed={run.seed}"], tmp_path / run.name)
        for key in ("trainer.max_steps", "trainer.val_check_interval", "checkpoint.every_n_steps"):
            section, name = key.split(".")
            recipe[section].pop(name), reference[section].pop(name)
        assert recipe == reference, run.name

    def without_paths(recipe: dict) -> dict:
        recipe = json.loads(json.dumps(recipe))
        for key in MACHINE_PATHS:
            section, name = key.split(".")
            recipe[section].pop(name, None)
        return recipe

    chosen = REPO / "docs" / "tuning" / "runs" / "lr=0.004,init_std=0.05,tau_ema=0.15,seed=0" / "recipe.yaml"
    dense = without_paths(run_recipe(paper, runs["dense,seed=0"], tmp_path / "dense"))
    assert dense == without_paths(yaml.safe_load(chosen.read_text()))
    for name, run in runs.items():
        recipe = without_paths(run_recipe(paper, run, tmp_path / name))
        seed = runs[f"dense,seed={name.split('seed=')[1]}"]
        reference = without_paths(run_recipe(paper, seed, tmp_path / "dense"))
        assert {**recipe["model"], "layer_dropout": None} == {**reference["model"], "layer_dropout": None}, name
        assert {k: v for k, v in recipe.items() if k != "model"} == {k: v for k, v in reference.items() if k != "model"}


def test_the_committed_early_exit_sweep_is_three_configurations_at_two_seeds(tmp_path, monkeypatch):
    """recipes/sweeps/early-exit-cpu.yaml: paper-cpu's model and settings; the early-exit
    loss's run differs from ILD+DTS by that loss alone, whose heads its prediction counts."""
    monkeypatch.chdir(REPO)  # the file names its base relative to the repository
    sweep = load_sweep(REPO / "recipes" / "sweeps" / "early-exit-cpu.yaml", data_dir=str(tmp_path))
    paper = load_sweep(REPO / "recipes" / "sweeps" / "paper-cpu.yaml", data_dir=str(tmp_path))
    runs = {run.name: run for run in sweep.runs}
    assert sorted(runs) == [f"{c},seed={s}" for c in ("dense", "ild-dts-0.4", "ild-dts-0.4-eel") for s in (0, 1)]
    recipes = {name: run_recipe(sweep, run, tmp_path / name) for name, run in runs.items()}
    paper_runs = {run.name: run for run in paper.runs}
    for name in ("dense,seed=0", "ild-dts-0.4,seed=1"):  # the reproduction's runs, unchanged
        assert recipes[name] == run_recipe(paper, paper_runs[name], tmp_path / name)
    plain, eel = recipes["ild-dts-0.4,seed=0"], recipes["ild-dts-0.4-eel,seed=0"]
    assert {**eel["model"], "early_exit_loss": None} == {**plain["model"], "early_exit_loss": None}
    assert predict(eel).training_flops > predict(plain).training_flops
    assert {spec.name for spec in sweep.evals} >= {"heldout", "speculate", "exit-draft-6", "skip-draft-odd"}


@pytest.mark.parametrize("change, dry, message", [
    ({"runs": {"x": {"model..decoder.d_model": 8}}}, True, "'model..decoder.d_model' is invalid"),
    ({"runs": {"x": {"model/decoder": 8}}}, True, "'model/decoder' is invalid"),
    ({"runs": {"x": {"model.decoder.d model": 8}}}, True, "'model.decoder.d model' is invalid"),
    ({"runs": {"x": {"model.decoder.d_modl": 8}}}, True,
     "runs.x key 'model.decoder.d_modl' is not a recipe key (did you mean 'model.decoder.d_model'?)"),
    ({"runs": {"x": {"model.layer_dropout.p_mx": 0.1}}}, False, "'model.layer_dropout.p_mx' is not a recipe key"),
    # once: caught only by a ~30 s `pretrain --print_config` per run, after the run folders were written
    ({"runs": {"x": {"trainer.max_stepz": 3}}}, True, "'trainer.max_stepz' is not a recipe key "
                                                      "(did you mean 'trainer.max_steps'?)"),
    ({"grid": {"data.batch_sise": [4, 8]}}, False, "grid key 'data.batch_sise' is not a recipe key "
                                                    "(did you mean 'data.batch_size'?)"),
    ({"overrides": {"model.parametrization.lrr": 0.01}}, True, "overrides key 'model.parametrization.lrr' is not "
                                                               "a recipe key (did you mean 'model.parametrization.lr'?)"),
])
def test_bad_keys_are_refused_in_one_line_before_anything_is_written(tmp_path, data, change, dry, message):
    path = sweep_file(tmp_path, data, **change)
    before = hashes(tmp_path, data)
    line = refused("sweep", str(path), "--out", str(tmp_path / "out"), *(["--dry-run"] if dry else []))
    assert message in line
    assert hashes(tmp_path, data) == before and not (tmp_path / "out").exists()


@pytest.mark.parametrize("change, message", [
    ({"overrides": {"model.lr_schedule": {"warmup_stepz": 0}}},  # inside a section's mapping too
     "overrides key 'model.lr_schedule.warmup_stepz' is not a recipe key"),
    ({"seed_keys": ["seed_everything", "data.sead"]}, "seed_keys key 'data.sead' is not a recipe key"),
    ({"base": "recipes/sweeps/paper-cpu.yaml"}, "base recipe 'recipes/sweeps/paper-cpu.yaml' key 'base' is not a "
                                                "recipe key"),  # a sweep file named as the base recipe
])
def test_keys_anywhere_in_the_file_are_checked(tmp_path, data, monkeypatch, change, message):
    monkeypatch.chdir(REPO)
    with pytest.raises(SweepError, match=re.escape(message)):
        load_sweep(sweep_file(tmp_path, data, **change))


@pytest.mark.parametrize("key, value", [
    ("data.storage_options.anon", True), ("trainer.strategy.init_args.stage", 2),  # below a mapping-valued key
    ("trainer.logger.class_path", "lightning.pytorch.loggers.CSVLogger"),
    ("model.lr_schedule", {"warmup_steps": 2}),  # a section as a mapping
])
def test_keys_below_a_mapping_valued_key_are_the_values_own(tmp_path, data, key, value):
    assert load_sweep(sweep_file(tmp_path, data, runs={"x": {key: value}})).runs


def test_every_committed_sweep_file_has_only_recipe_keys(monkeypatch, tmp_path):
    """recipes/sweeps/*.yaml and probes/*.yaml load (every key checked against `pretrain`'s
    parser); a tune file through tune's own reader. No run starts."""
    from eval.experiments.sweep.tune import load_tune

    monkeypatch.chdir(REPO)  # the files name their bases relative to the repository
    sweeps = REPO / "recipes" / "sweeps"
    files = sorted(sweeps.glob("*.yaml")) + sorted(sweeps.glob("probes/*.yaml"))
    assert len(files) >= 8
    for path in files:
        if "tune" in yaml.safe_load(path.read_text()):
            load_tune(path, data_dir=str(tmp_path))
        else:
            assert load_sweep(path, data_dir=str(tmp_path)).runs


def test_a_run_another_process_holds_is_waited_for_and_then_found_done(tmp_path, data, capsys):
    """Two sweeps sharing a folder: a run the other one holds (its run-folder lock,
    framework/files/run_lock.py) is waited for, not failed as "did not finish (None)";
    once the holder is gone the run is found finished and nothing runs again."""
    import socket
    import threading

    from framework.files.run_lock import LOCK_FILE

    sweep = load_sweep(sweep_file(tmp_path, data, evals=[]))
    run = sweep.runs[0]
    runner = Runner(sweep, tmp_path / "out", threads=1)
    runner.wait_seconds = 0.05
    folder = RunFolder(runner.root, run)
    folder.dir.mkdir(parents=True)
    folder.recipe.write_text(yaml.safe_dump(run_recipe(sweep, run, folder.dir.resolve()), sort_keys=False))
    folder.config.write_text("# the resolved config\n")
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    (folder.dir / LOCK_FILE).write_text(json.dumps({"pid": holder.pid, "host": socket.gethostname(),
                                                    "command": "sweep", "heartbeat": time.time(), "token": "ab"}))
    result: dict = {}
    waiting = threading.Thread(target=lambda: result.update(runner.run(run)))
    waiting.start()
    try:
        deadline = time.monotonic() + 60
        while "waiting" not in capsys.readouterr().out:
            assert waiting.is_alive() and time.monotonic() < deadline, result
            time.sleep(0.05)
        folder.summary.write_text("{}")  # the other sweep finishes the run, then exits
    finally:
        holder.kill()
        holder.wait()
    waiting.join(timeout=60)
    assert result["state"] == "done", result
    assert "pretrain" not in result["stages"]
    assert not (folder.dir / LOCK_FILE).exists()


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(900)
def test_two_sweeps_sharing_a_folder_both_finish_and_train_each_run_once(tmp_path, data):
    """Both once exited 1 with "did not finish … (None)" for the runs the other held."""
    path = sweep_file(tmp_path, data, evals=[], runs={}, seeds=[0])
    spec = yaml.safe_load(path.read_text())
    spec["overrides"].update({"trainer.max_steps": 4, "trainer.val_check_interval": 4})
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    out = tmp_path / "out"
    command = [*_sweep_command(path, out)[:-4], "--jobs", "1", "--threads-per-job", "1"]
    sweeps = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
              for _ in range(2)]
    outputs = [sweep.communicate(timeout=800)[0] for sweep in sweeps]
    assert [sweep.returncode for sweep in sweeps] == [0, 0], outputs
    for run in ("p_max=0.0,seed=0", "p_max=0.5,seed=0"):
        assert json.loads((out / "runs" / run / "summary.json").read_text())["steps"] == 4
        assert _status(out, run)["state"] == "done"
        assert _status(out, run)["stages"]["pretrain"]["attempts"] == 1, outputs

"""Compute-matched baselines: the sweep's flops_matched block, and report's equal-FLOPs finding
on hand-made run folders."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml

from eval.experiments.sweep.compute_matched import length_settings, matched_steps, validation_interval
from eval.experiments.report.build import build_report
from eval.experiments.sweep.runner import main
from eval.experiments.sweep.spec import SweepError, load_sweep, predict, run_recipe
from framework.training.lr_schedule import LRScheduleConfig, schedule_for
from tests.eval.experiments.run_folders import slices, write_run

REPO = Path(__file__).resolve().parents[4]


def sweep_file(folder: Path, block: object, **extra) -> Path:
    data = folder / "data"
    data.mkdir(exist_ok=True)
    (data / "manifest.json").write_text("{}")  # prepared: nothing to prepare, nothing here trains
    spec = {"base": str(REPO / "recipes" / "tiny.yaml"), "data": {"dir": str(data)},
            "overrides": {"trainer.max_steps": 200, "trainer.val_check_interval": 50, "checkpoint.every_n_steps": 200,
                          "model.lr_schedule": {"warmup_steps": 0, "warmup_fraction": 0.1}},
            "runs": {"dense": {"model.layer_dropout.p_max": 0.0, "seeds": [0, 1, 2]},
                     "ild-dts-0.4": {"model.layer_dropout.p_max": 0.4},
                     "ild-dts-0.8": {"model.layer_dropout.p_max": 0.8},
                     "ild-0.4": {"model.layer_dropout": {"p_max": 0.4, "schedule": "constant"}}},
            "seeds": [0, 1], "flops_matched": block,
            "evals": [{"name": "heldout", "command": "eval heldout", "args": {"groups": 2}}], **extra}
    path = folder / "sweep.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def test_steps_intervals_by_hand():
    assert matched_steps(1000, 1000.0, 822.4, float) == 822  # FLOPs proportional to steps
    assert matched_steps(1000, 1000.0, 822.6, float) == 823
    # FLOPs not proportional (a fixed cost): the neighbour nearest the target wins
    assert matched_steps(100, 110.0, 90.0, lambda n: n + 10.0) == 80
    assert validation_interval(250, 800) == 200 and validation_interval(250, 900) == 225
    assert validation_interval(250, 1000) == 250 and validation_interval(250, 797) == 797  # prime: the end only
    # Lightning's interval counts micro-batches: 800 steps × 2 = 1600 batches (200: log-nearer than 320)
    recipe = {"trainer": {"val_check_interval": 250, "accumulate_grad_batches": 2}, "checkpoint": {"every_n_steps": 900}}
    assert length_settings(recipe, 800) == {"trainer.val_check_interval": 200, "checkpoint.every_n_steps": 800}
    assert length_settings({"trainer": {"val_check_interval": 1.0}}, 800) == {}  # a fraction of an epoch: kept


def test_flops_matched_runs_train_to_their_targets_flops_with_their_own_schedule(tmp_path):
    sweep = load_sweep(sweep_file(tmp_path, {"baseline": "dense", "to": ["*"], "seeds": [0, 1]}))
    matched = [r for r in sweep.runs if r.matches]
    # non-embedding FLOPs (the default): P̄ 10% and 20% of 200 steps saved -> 180 and 160 steps;
    # ILD 0.4 (constant) and ILD+DTS 0.8 both save P̄ 20%: one budget, one run per seed
    assert {r.config_name: r.matches for r in matched} == {"dense-steps=180": ("ild-dts-0.4",),
                                                           "dense-steps=160": ("ild-dts-0.8", "ild-0.4")}
    assert sorted(r.name for r in matched) == ["dense-steps=160,seed=0", "dense-steps=160,seed=1",
                                               "dense-steps=180,seed=0", "dense-steps=180,seed=1"]
    for run in matched:
        recipe = run_recipe(sweep, run, tmp_path)
        steps = recipe["trainer"]["max_steps"]
        assert run.name == f"dense-steps={steps},seed={run.seed}" and recipe["model"]["layer_dropout"]["p_max"] == 0.0
        # validated on its last step (40 divides 160, 45 divides 180: the divisors nearest 50),
        # checkpointed within its length
        assert recipe["trainer"]["val_check_interval"] == {160: 40, 180: 45}[steps]
        assert recipe["checkpoint"]["every_n_steps"] == steps
        # its own full schedule: warmup 10% of its steps, linear to ~0 at its own last step
        factor = schedule_for(LRScheduleConfig(**recipe["model"]["lr_schedule"]), steps)
        assert factor(round(0.1 * steps) - 1) == pytest.approx(1.0) and factor(steps - 1) < 1.5 / steps
    # executed FLOPs (the unembedding too, which dropout does not save): longer, within one step
    sweep = load_sweep(sweep_file(tmp_path, {"baseline": "dense", "to": ["ild-dts-0.8"], "count": "executed"}))
    [run, *_] = [r for r in sweep.runs if r.matches]
    dense, target = (predict(run_recipe(sweep, r, tmp_path)).training_flops
                     for r in (sweep.runs[0], next(r for r in sweep.runs if r.config_name == "ild-dts-0.8")))
    recipe = run_recipe(sweep, run, tmp_path)
    assert recipe["trainer"]["max_steps"] > 160 and abs(predict(recipe).training_flops - target) <= dense / 200
    # "total" names that convention ("executed" is its older name): the same run
    total = load_sweep(sweep_file(tmp_path, {"baseline": "dense", "to": ["ild-dts-0.8"], "count": "total"}))
    assert [r.name for r in total.runs if r.matches] == [r.name for r in sweep.runs if r.matches]
    # seeds default to the baseline's
    assert sorted(r.seed for r in sweep.runs if r.matches) == [0, 1, 2]


@pytest.mark.parametrize("block, message", [
    ({"baseline": "dense", "to": ["ild-dts-0.3"]}, "flops_matched.to has 'ild-dts-0.3'"),
    ({"baseline": "dense", "to": ["dense"]}, "flops_matched.to has 'dense'"),
    ({"baseline": "dns", "to": ["*"]}, "flops_matched.baseline='dns' is invalid: expected one of"),
    ({"baseline": "dense", "to": "ild-dts-0.4"}, "flops_matched.to='ild-dts-0.4' is invalid"),
    ({"baseline": "dense", "to": ["*"], "seed": [0]}, "flops_matched keys \\['seed'\\] are invalid"),
    ({"baseline": "dense", "to": ["*"], "seeds": [0, 0]}, "flops_matched.seeds=\\[0, 0\\] is invalid"),
    ({"baseline": "dense", "to": ["*"], "count": "blocks"}, "flops_matched.count='blocks' is invalid"),
    (["dense"], "flops_matched=\\['dense'\\] is invalid"),
])
def test_a_bad_block_is_one_line_naming_the_value_before_anything_runs(tmp_path, capsys, block, message):
    path = sweep_file(tmp_path, block)
    with pytest.raises(SweepError, match=message):
        load_sweep(path)
    assert main([str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: flops_matched") and not (tmp_path / "out").exists()


def test_dry_run_only_and_adoption_of_compute_matched_runs(tmp_path, capsys):
    path = sweep_file(tmp_path, {"baseline": "dense", "to": ["ild-dts-0.8"], "seeds": [0]})
    sweep = load_sweep(path)
    [run] = [r for r in sweep.runs if r.matches]
    assert main([str(path), "--out", str(tmp_path / "out"), "--dry-run", "--only", "dense-steps=*"]) == 0
    out = capsys.readouterr().out
    steps = run_recipe(sweep, run, tmp_path)["trainer"]["max_steps"]
    assert f"{run.name}" in out and f"{steps:>7,}" in out and "1 runs" in out and "dense,seed=0" not in out
    assert f"{run.config_name} (" in out and "ild-dts-0.8 +0.00% / " in out  # its FLOPs beside its target's
    # a committed report holding it finished: adopted, not run
    report = tmp_path / "docs"
    folder = report / "runs" / run.name
    (folder / "evals").mkdir(parents=True)
    recipe = run_recipe(sweep, run, Path("/elsewhere") / run.name)
    (folder / "recipe.yaml").write_text(yaml.safe_dump(recipe, sort_keys=False))
    (folder / "summary.json").write_text(json.dumps({"steps": steps}))
    (folder / "evals" / "heldout.json").write_text(json.dumps({"loss": 5.0}))
    assert main([str(path), "--out", str(tmp_path / "out"), "--dry-run", "--only", "dense-steps=*",
                 "--done-from", str(report)]) == 0
    assert "(adopted, not run)" in capsys.readouterr().out


# ------------------------------------------------------------------- the report side
def matched_sweep(root: Path, *, with_baselines: bool = True) -> Path:
    """dense × 3 seeds; ILD+DTS 0.4 (P̄ 10%) × 2; ILD+DTS 0.8 and ILD 0.4 (P̄ 20%) × 2; and the
    dense runs trained to 90 and 80 of the 100 steps (the hand-made FLOPs are proportional to
    steps × (1 − P̄))."""
    for seed, mean in enumerate((3.00, 3.02, 3.01)):
        write_run(root, f"dense,seed={seed}", seed, slices(mean))
    for seed, mean in enumerate((3.05, 3.06)):
        write_run(root, f"ild-dts-0.4,seed={seed}", seed, slices(mean), p_max=0.4)
    for seed, mean in enumerate((3.10, 3.13)):
        write_run(root, f"ild-dts-0.8,seed={seed}", seed, slices(mean), p_max=0.8)
    for seed, mean in enumerate((3.15, 3.16)):
        write_run(root, f"ild-0.4,seed={seed}", seed, slices(mean), p_max=0.4, schedule="constant")
    if with_baselines:
        for seed, mean in enumerate((3.07, 3.08)):  # at 90 steps: worse than ILD+DTS 0.4 by 0.02 a seed
            write_run(root, f"dense-steps=90,seed={seed}", seed, slices(mean), steps=90,
                      settings={"trainer": {"val_check_interval": 45}})
        for seed, mean in enumerate((3.12, 3.14)):  # at 80 steps
            write_run(root, f"dense-steps=80,seed={seed}", seed, slices(mean), steps=80)
    return root


def test_equal_flops_compares_each_dropout_run_with_its_compute_matched_dense_run(tmp_path):
    report, _ = build_report(matched_sweep(tmp_path / "sweep"))
    rows = {r["configuration"]: r for r in report["configurations"]}
    # found by what they are (length only differs, FLOPs those of the dropout runs), labelled so
    assert rows["dense, 90 steps (compute-matched)"]["compute_matched_to"] == ["ILD+DTS p_max=0.4"]
    assert rows["dense, 80 steps (compute-matched)"]["compute_matched_to"] == ["ILD p_max=0.4", "ILD+DTS p_max=0.8"]
    assert rows["dense"]["steps"] == 100 and report["noise"]["baseline"] == "dense"
    assert "vs_dense" not in rows["dense, 90 steps (compute-matched)"]
    finding = {f["id"]: f for f in report["findings"]}["pareto"]
    by_a = {c["a"]: c for c in finding["comparisons"]}
    dts = by_a["ILD+DTS p_max=0.4"]
    # paired over seeds 0, 1: (3.05 − 3.07, 3.06 − 3.08); the paired noise is the residual of the
    # 6 configurations × 2 seeds block (dense's seed 2 fits exactly): σ² = var(seed steps)/2, 5 dof
    seed_steps = [0.02, 0.01, 0.03, 0.01, 0.01, 0.02]
    sigma = math.sqrt(sum((s - sum(seed_steps) / 6) ** 2 for s in seed_steps) / 5 / 2)
    assert dts["b"] == "dense, 90 steps (compute-matched)" and dts["paired"] == 2
    assert dts["diff"] == pytest.approx(-0.02) and dts["se"] == pytest.approx(sigma) and dts["dof"] == 5
    assert dts["verdict"] == "better" and not dts["observation"]
    assert by_a["ILD+DTS p_max=0.8"]["diff"] == pytest.approx(3.115 - 3.13)
    assert by_a["ILD p_max=0.4"]["observation"]  # not the recommended recipe: shown, not counted
    assert by_a["ILD p_max=0.4"]["diff"] == pytest.approx(3.155 - 3.13)  # worse, and counted for nothing
    assert finding["verdict"] == "reproduced" and finding["no_baseline"] == []
    # the others are judged as before: the compute-matched runs are no configuration of theirs
    assert {c["b"] for c in {f["id"]: f for f in report["findings"]}["cost-at-equal-steps"]["comparisons"]} == {"dense"}


def test_without_compute_matched_runs_there_is_no_equal_flops_verdict(tmp_path):
    report, _ = build_report(matched_sweep(tmp_path / "sweep", with_baselines=False))
    finding = {f["id"]: f for f in report["findings"]}["pareto"]
    assert finding["verdict"] == "no compute-matched baseline" and finding["comparisons"] == []
    assert finding["no_baseline"] == ["ILD p_max=0.4", "ILD+DTS p_max=0.4", "ILD+DTS p_max=0.8"]
    # a shorter dense run whose FLOPs match no dropout configuration is an ordinary run
    write_run(tmp_path / "sweep", "dense-steps=50,seed=0", 0, slices(3.5), steps=50)
    report, _ = build_report(tmp_path / "sweep")
    assert {r["configuration"] for r in report["configurations"]} >= {"dense, max_steps=50", "dense, max_steps=100"}

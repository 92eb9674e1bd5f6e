"""A stage's CPU time while it runs: sampled from a real busy child, written beside the stage as
``in_flight``, and folded into the totals as a killed attempt when the sweep died before reaping
it (a session's end), so the report's CPU-hours count every attempt."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from eval.experiments.sweep.attempt_meter import AttemptMeter, stage_entry, tree_cpu_seconds
from eval.experiments.sweep.results import RunResult
from eval.experiments.sweep.run_folder import RunFolder
from eval.experiments.sweep.runner import Runner
from eval.experiments.sweep.spec import load_sweep, run_recipe

REPO = Path(__file__).resolve().parents[4]
BUSY = "import time\nend = time.process_time() + {seconds}\nwhile time.process_time() < end: pass\n"


def busy(seconds: float, then: str = "") -> list[str]:
    return [sys.executable, "-c", BUSY.format(seconds=seconds) + then]


def test_a_busy_childs_cpu_time_is_read_while_it_runs_and_none_once_it_is_gone():
    child = subprocess.Popen(busy(0.6, "import time; time.sleep(30)"))
    try:
        seen = 0.0
        for _ in range(200):
            seen = tree_cpu_seconds(child.pid) or 0.0
            if seen >= 0.5:
                break
            time.sleep(0.05)
        assert seen >= 0.5  # its spin, read from outside before it ends
    finally:
        child.kill()
        child.wait()
    assert tree_cpu_seconds(child.pid) is None


def test_the_meter_reports_rising_cpu_until_stopped():
    child = subprocess.Popen(busy(0.8))
    reports: list[tuple[float, float]] = []
    meter = AttemptMeter(child.pid, lambda cpu, wall: reports.append((cpu, wall)), every=0.05).start()
    child.wait()
    meter.stop()
    after = len(reports)
    assert after >= 3
    cpus, walls = [c for c, _ in reports], [w for _, w in reports]
    assert cpus == sorted(cpus) and walls == sorted(walls) and cpus[-1] > 0.2
    assert not meter.thread.is_alive() and len(reports) == after


def test_a_killed_attempts_in_flight_counts_once_as_a_killed_attempt():
    status = {"stages": {"pretrain": {"cpu_seconds": 5.0, "wall_seconds": 6.0, "attempts": 1, "returncode": 0,
                                      "in_flight": {"cpu_seconds": 100.0, "wall_seconds": 120.0}}}}
    assert RunResult(name="r", folder=Path("."), config={}, summary={}, status=status, evals={},
                     seed=0).cpu_seconds == 105.0  # read by a report before the run resumed
    entry = stage_entry(status, "pretrain")
    assert entry == {"cpu_seconds": 105.0, "wall_seconds": 126.0, "attempts": 2, "returncode": 0,
                     "killed_attempts": 1}
    assert stage_entry(status, "pretrain") == entry  # folded once
    assert stage_entry(status, "heldout") == {"cpu_seconds": 0.0, "wall_seconds": 0.0, "attempts": 0}


@pytest.fixture()
def run_folder(tmp_path) -> tuple[Runner, RunFolder]:
    """A one-run sweep whose folder is ready to train (recipe and config written)."""
    spec = {"base": str(REPO / "recipes" / "tiny.yaml"), "data": {"dir": str(tmp_path / "data")},
            "runs": {"dense": {"model.layer_dropout.p_max": 0.0}}, "seeds": [0], "evals": []}
    (tmp_path / "sweep.yaml").write_text(yaml.safe_dump(spec))
    sweep = load_sweep(tmp_path / "sweep.yaml")
    runner = Runner(sweep, tmp_path / "out", threads=1)
    runner.meter_seconds = 0.05
    folder = RunFolder(runner.root, sweep.runs[0])
    folder.dir.mkdir(parents=True)
    folder.recipe.write_text(yaml.safe_dump(run_recipe(sweep, sweep.runs[0], folder.dir.resolve()), sort_keys=False))
    folder.config.write_text("# the resolved config\n")
    return runner, folder


def test_a_sweep_killed_mid_training_keeps_its_attempts_cpu_for_the_next_one(run_folder, monkeypatch):
    runner, folder = run_folder
    # the first attempt: the sweep dies (a session's end) while training runs, after its meter wrote
    monkeypatch.setattr(runner, "train_argv", lambda f: (busy(30), runner.env()))
    real_reap = Runner.reap

    def metered() -> float:
        stage = json.loads(folder.status_file.read_text())["stages"].get("pretrain", {})
        return (stage.get("in_flight") or {}).get("cpu_seconds", 0.0)

    def dies(self, child, meter=None):
        while metered() < 0.3:
            time.sleep(0.02)
        child.kill()
        real_reap(self, child, meter)
        raise SystemExit("killed")

    monkeypatch.setattr(Runner, "reap", dies)
    with pytest.raises(SystemExit):
        runner.run(runner.sweep.runs[0])
    lost = json.loads(folder.status_file.read_text())["stages"]["pretrain"]
    assert lost["attempts"] == 0 and lost["in_flight"]["cpu_seconds"] >= 0.3
    # the next attempt trains to the end: the killed one's CPU is folded in, its own replaces its meter's
    monkeypatch.setattr(Runner, "reap", real_reap)
    finish = f"from pathlib import Path; Path({str(folder.summary)!r}).write_text('{{}}')"
    monkeypatch.setattr(runner, "train_argv", lambda f: (busy(0.3, finish), runner.env()))
    status = runner.run(runner.sweep.runs[0])
    pretrain = status["stages"]["pretrain"]
    assert status["state"] == "done" and "in_flight" not in pretrain
    assert pretrain["attempts"] == 2 and pretrain["killed_attempts"] == 1
    assert pretrain["cpu_seconds"] >= lost["in_flight"]["cpu_seconds"] + 0.25
    assert json.loads(folder.status_file.read_text())["stages"]["pretrain"] == pretrain

"""`layerdrop sweep --slurm`: every value in array.sbatch is quoted, and what sbatch's own
#SBATCH lines cannot hold is refused before anything is written (issue 23, item 10).

The data folder here only needs its manifest: writing the job array reads nothing else
(the sweep's training is tested end to end in test_sweep.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.eval.experiments.sweep.test_runner import REPO, sweep_file

HOSTILE = "a dir $(touch PWNED) `touch PWNED2` ;x"


def layerdrop_sweep(cwd: Path, *args: str | Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "framework.cli", "sweep", *map(str, args)], cwd=cwd,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=300)


@pytest.fixture()
def hostile(tmp_path) -> Path:
    folder = tmp_path / HOSTILE
    (folder / "data").mkdir(parents=True)
    (folder / "data" / "manifest.json").write_text("{}\n")
    sweep_file(folder, folder / "data")
    return folder


def test_paths_with_spaces_and_substitutions_reach_the_task_as_they_are(hostile, tmp_path):
    out = hostile / "out"
    written = layerdrop_sweep(hostile, hostile / "sweep.yaml", "--out", out, "--slurm")
    assert written.returncode == 0, written.stderr
    script = (out / "slurm" / "array.sbatch").read_text()
    assert f'#SBATCH --output="{(out / "slurm").resolve()}/%A_%a.out"' in script
    # the task's shell part as bash runs it on a node, its final exec printing the words it would run
    task = subprocess.run(["bash", "-c", script.replace("\nexec ", "\nprintf '%s\\n' ")], cwd=tmp_path,
                          env={**os.environ, "SLURM_ARRAY_TASK_ID": "1"}, capture_output=True, text=True, timeout=60)
    assert task.returncode == 0, task.stderr
    second_run = (out / "slurm" / "runs.txt").read_text().splitlines()[1]
    assert task.stdout.splitlines() == [
        sys.executable, "-m", "framework.cli", "sweep", str((out / "sweep.yaml").resolve()),
        "--out", str(out.resolve()), "--data", str((hostile / "data").resolve()),
        "--only", second_run, "--launcher", "slurm-task"]
    assert not list(tmp_path.rglob("PWNED*"))  # no substitution ran, here or in the task


@pytest.mark.parametrize("args, words", [
    (["--slurm-time", "1:00:00 $(touch PWNED)"], ["--slurm-time", "[days-]hours:minutes:seconds"]),
    (["--slurm-time", "1:00:00\n#SBATCH --partition=other"], ["--slurm-time"]),
])
def test_a_time_that_is_not_a_time_is_refused_before_anything_is_written(hostile, args, words):
    before = sorted(p.name for p in hostile.rglob("*"))
    result = layerdrop_sweep(hostile, hostile / "sweep.yaml", "--out", hostile / "out", "--slurm", *args)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert all(w in lines[0] for w in words), lines[0]
    assert sorted(p.name for p in hostile.rglob("*")) == before


@pytest.mark.parametrize("name", ["logs%j", 'say "hi"'])
def test_an_out_folder_an_sbatch_line_cannot_hold_is_refused(hostile, name):
    before = sorted(p.name for p in hostile.rglob("*"))
    result = layerdrop_sweep(hostile, hostile / "sweep.yaml", "--out", hostile / name, "--slurm")
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert "--out" in lines[0] and "#SBATCH" in lines[0]
    assert sorted(p.name for p in hostile.rglob("*")) == before

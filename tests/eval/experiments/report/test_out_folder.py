"""`layerdrop report --out`: a report never replaces what it did not write (issue 23, item 2).

Run as a user runs it (a subprocess): a refusal is exit status 2 and one line, before any
work, and every file already in the folder keeps its bytes."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from eval.experiments.report.build import main
from tests.eval.experiments.report.test_build import slices, write_run


def layerdrop_report(*args: str | Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "framework.cli", "report", *map(str, args)], capture_output=True,
                          text=True, timeout=300)


def tree_hashes(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def assert_refused(result: subprocess.CompletedProcess, *words: str) -> None:
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr and all(w in lines[0] for w in words), lines[0]


@pytest.fixture()
def sweep(tmp_path) -> Path:
    root = tmp_path / "sweep"
    for seed, mean in enumerate((3.00, 3.02)):
        write_run(root, f"dense,seed={seed}", seed, slices(mean))
        write_run(root, f"good,seed={seed}", seed, slices(mean - 0.1), p_max=0.4)
    return root


def test_another_sweeps_folder_is_never_written_into(sweep, tmp_path):
    other = tmp_path / "other-sweep"
    write_run(other, "theirs,seed=0", 0, slices(2.5))
    (other / "sweep.yaml").write_text("grid: {}\n")
    before = tree_hashes(other)
    for extra in ([], ["--overwrite"]):
        assert_refused(layerdrop_report(sweep, "--out", other, *extra), str(other), "holds no report")
        assert tree_hashes(other) == before


def test_a_file_as_out_is_refused(sweep, tmp_path):
    target = tmp_path / "notes.txt"
    target.write_text("mine\n")
    assert_refused(layerdrop_report(sweep, "--out", target, "--overwrite"), "is a file")
    assert target.read_text() == "mine\n"


def test_a_report_is_replaced_only_with_overwrite_and_only_what_it_wrote(sweep, tmp_path):
    out = tmp_path / "report"
    assert main([str(sweep), "--out", str(out)]) == 0
    (out / "images" / "from-an-older-report.png").write_bytes(b"stale")
    (out / "notes.md").write_text("a person's notes\n")
    before = tree_hashes(out)
    assert_refused(layerdrop_report(sweep, "--out", out), "already holds a report", "--overwrite")
    assert tree_hashes(out) == before

    (sweep / "runs" / "good,seed=1").rename(sweep / "runs" / "renamed,seed=1")
    replaced = layerdrop_report(sweep, "--out", out, "--overwrite")
    assert replaced.returncode == 0, replaced.stderr
    assert not (out / "images" / "from-an-older-report.png").exists()
    assert not (out / "runs" / "good,seed=1").exists() and (out / "runs" / "renamed,seed=1").is_dir()
    assert (out / "notes.md").read_text() == "a person's notes\n"
    assert "renamed,seed=1" in (out / "report.json").read_text()


def test_a_report_rebuilt_in_place_keeps_its_runs_copy(sweep, tmp_path):
    out = tmp_path / "report"
    assert main([str(sweep), "--out", str(out)]) == 0
    first = json.loads((out / "report.json").read_text())
    runs = {k: v for k, v in tree_hashes(out).items() if k.startswith("runs/")}
    assert main([str(out), "--out", str(out), "--overwrite"]) == 0
    assert {k: v for k, v in tree_hashes(out).items() if k.startswith("runs/")} == runs
    assert json.loads((out / "report.json").read_text())["configurations"] == first["configurations"]

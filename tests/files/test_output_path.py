"""Output paths are checked before any work: a folder where a file goes, a file where a
folder goes, a path nothing can be written below, an existing file without --overwrite."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from framework.files.output_path import file_problem, folder_problem
from tests.helpers.refusals import hashes, refused


def test_the_file_rule(tmp_path):
    (tmp_path / "old.json").write_text("{}")
    (tmp_path / "a_file").write_text("x")
    assert file_problem(tmp_path / "new.json", overwrite=False) is None
    assert file_problem(tmp_path / "deep" / "new.json", overwrite=False) is None  # folders are made
    assert file_problem(tmp_path / "old.json", overwrite=True) is None
    assert "already exists; pass --overwrite" in file_problem(tmp_path / "old.json", overwrite=False)
    assert "is a folder; name the file to write" in file_problem(tmp_path, overwrite=True)
    assert f"{str(tmp_path / 'a_file')!r} is a file, not a folder" in file_problem(tmp_path / "a_file" / "r.json", True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file", "old.json"]  # the probe left nothing


def test_the_folder_rule(tmp_path):
    (tmp_path / "a_file").write_text("x")
    assert folder_problem(tmp_path / "new" / "export") is None
    assert folder_problem(tmp_path) is None
    assert "is a file, not a folder" in folder_problem(tmp_path / "a_file")
    assert "cannot be written" in folder_problem(tmp_path / "a_file" / "export")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc takes no new files on Linux")
def test_a_folder_that_takes_no_file_is_found_even_as_root():
    assert "is not writable" in folder_problem(Path("/proc/layerdrop-test/export"))


# -- the commands, as a user runs them: refused in one line before loading anything --------


@pytest.fixture
def workspace(tmp_path):
    """A checkpoint path that is not a checkpoint: a command that loaded it before
    checking --out would fail on it instead; and outputs in the way."""
    (tmp_path / "model.ckpt").write_bytes(b"not a checkpoint")
    (tmp_path / "report.json").write_text("{}")
    (tmp_path / "reports").mkdir()
    (tmp_path / "reports" / "kept.json").write_text("{}")
    (tmp_path / "data").mkdir()
    return tmp_path


def test_export_refuses_a_file_or_an_unwritable_out_before_loading(workspace):
    before = hashes(workspace)
    line = refused("export", "--ckpt", str(workspace / "model.ckpt"), "--out", str(workspace / "report.json"))
    assert f"--out {str(workspace / 'report.json')!r} is a file, not a folder" in line
    line = refused("export", "--ckpt", str(workspace / "model.ckpt"), "--out", str(workspace / "report.json" / "x"))
    assert "cannot be written" in line and "is a file, not a folder" in line
    assert hashes(workspace) == before


@pytest.mark.parametrize("command", [["eval", "exits", "--data", "{data}"], ["generate", "--prompt", "hi"]])
def test_eval_and_generate_refuse_a_folder_as_out_even_with_overwrite(command, workspace):
    before = hashes(workspace)
    argv = [arg.format(data=workspace / "data") for arg in command]
    line = refused(*argv, "--ckpt", str(workspace / "model.ckpt"), "--out", str(workspace / "reports"), "--overwrite")
    assert f"{str(workspace / 'reports')!r} is a folder; name the file to write" in line
    assert hashes(workspace) == before


def test_recipe_refuses_a_folder_as_out_even_with_overwrite(workspace):
    base = Path(__file__).resolve().parents[2] / "recipes" / "base.yaml"
    before = hashes(workspace)
    line = refused("recipe", "--base", str(base), "--size", "271M", "--tpp", "20", "--memory", "141GB",
                   "--out", str(workspace / "reports"), "--overwrite")
    assert line.startswith(f"error: --out {str(workspace / 'reports')!r} is a folder")
    assert hashes(workspace) == before

"""framework/files/staging.py: the one staging protocol (its users' own rules:
tests/checkpoint/test_folder.py, tests/data_prep/test_output_folder.py)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from framework.files.staging import clean_leftovers, hidden, is_url, publish

ROOT = Path(__file__).resolve().parents[2]


def _dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def test_publish_moves_the_old_target_aside_and_leaves_only_the_new(tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "old.txt").write_text("old")
    staging = hidden(tmp_path / "out", "staging", owner=7)
    assert staging.name == ".out.staging-7"
    staging.mkdir()
    (staging / "new.txt").write_text("new")
    publish(staging, tmp_path / "out", owner=7, durable=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["new.txt"]


def test_one_cleaner_serves_a_locked_folder_and_an_unlocked_target(tmp_path):
    dead, alive = _dead_pid(), os.getppid()
    for name in (".a.staging", f".b.staging-{dead}", f".b.staging-{alive}", ".a.link", "..a.partial-1-2"):
        (tmp_path / name).mkdir()
    (tmp_path / f".b.replaced-{dead}").mkdir()
    assert clean_leftovers(tmp_path, "b") == [f".b.staging-{dead}"]
    assert (tmp_path / "b").is_dir()  # moved aside, its replacement never came: put back
    assert clean_leftovers(tmp_path) == ["..a.partial-1-2", ".a.link", ".a.staging"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [f".b.staging-{alive}", "b"]


def test_urls_are_left_to_their_library():
    assert is_url("s3://bucket/data") and is_url("gs://b/x") and is_url("local:/data")
    assert not is_url("data/builtin-2k") and not is_url(Path("/tmp/x"))


def test_the_url_rule_has_one_home():
    """A second copy of the rule drifts (one had litdata's ``local:``, others did not)."""
    found = []
    for top in ("framework", "eval", "data_prep"):
        for path in sorted((ROOT / top).rglob("*.py")):
            for number, line in enumerate(path.read_text().splitlines(), 1):
                code = line.split("#")[0]
                if re.search(r"""["']://["']""", code) and path.name != "staging.py":
                    found.append(f"{path.relative_to(ROOT)}:{number}")
    assert found == []

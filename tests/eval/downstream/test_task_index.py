"""The lm-eval task index cache (eval/downstream/task_index.py): named the same in every process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import eval.downstream.task_index as task_index

REPO = Path(__file__).resolve().parents[3]


def test_every_process_names_the_same_cache_file(tmp_path):
    """Issue 46: the name came from ``hash(str)``, salted per process (PYTHONHASHSEED), so no
    run found the last one's index: each re-indexed (40-56 s) and left another file."""
    probe = "from eval.downstream.task_index import _cache_file; print(_cache_file())"
    names = set()
    for seed in ("1", "2", "random"):
        env = {**os.environ, "PYTHONHASHSEED": seed, "XDG_CACHE_HOME": str(tmp_path), "PYTHONPATH": str(REPO)}
        done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=300)
        assert done.returncode == 0, done.stderr
        names.add(done.stdout.strip())
    assert len(names) == 1
    assert Path(names.pop()).parent == tmp_path / "layerdrop"


def test_a_cached_index_is_read_back(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    cache = task_index._cache_file()
    cache.parent.mkdir(parents=True)
    cache.write_text('["arc_easy", "piqa"]')
    assert task_index.builtin_index() == {"arc_easy", "piqa"}


@pytest.mark.slow
def test_a_broken_cached_index_is_built_again(tmp_path, monkeypatch, capsys):
    """A cache that is JSON but not a list (or nested too deep) was a TypeError traceback."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    cache = task_index._cache_file()
    cache.parent.mkdir(parents=True)
    cache.write_text("3")
    names = task_index.builtin_index()
    assert {"arc_easy", "piqa", "copa"} <= names and "indexing lm-eval's built-in tasks once" in capsys.readouterr().err
    assert set(json.loads(cache.read_text())) == names

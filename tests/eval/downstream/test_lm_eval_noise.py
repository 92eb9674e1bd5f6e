"""lm-eval's own lines kept out of `layerdrop eval downstream` (eval/downstream/lm_eval_noise.py)."""

from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

from eval.downstream.lm_eval_noise import _WithoutBootstrapLines, quiet_task_warnings
from tests.eval.tiny_lm import export_tiny_model

REPO = Path(__file__).resolve().parents[3]


def test_a_packaged_run_outside_a_repository_prints_only_its_tables(tmp_path):
    """Issue 46: copa's "[Task: copa] metric acc is defined, but aggregation is not…" (twice),
    git's "fatal: not a git repository" and lambada's "bootstrapping for stddev: perplexity"
    reached the output of a plain run."""
    model = export_tiny_model(tmp_path / "model")
    out = tmp_path / "work" / "r.json"
    out.parent.mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "framework.cli", "eval", "downstream", "--ckpt", str(model),
                           "--tasks", "copa,lambada_openai", "--limit", "6", "--out", str(out)],
                          capture_output=True, text=True, env=env, cwd=out.parent, timeout=600)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert not any(line.startswith("bootstrapping") for line in done.stdout.splitlines()), done.stdout
    assert "|copa" in done.stdout and "|lambada_openai" in done.stdout and f"wrote {out}" in done.stdout
    report = json.loads(out.read_text())
    assert report["n-samples"]["copa"]["effective"] == 6


def test_the_filters_drop_only_what_they_name(caplog):
    quiet_task_warnings()
    logger = logging.getLogger("lm_eval.api.task")
    with caplog.at_level(logging.WARNING, logger="lm_eval.api.task"):
        logger.warning("[Task: copa] metric acc is defined, but aggregation is not. using default aggregation=mean")
        logger.warning("[Task: mine] something else")
    assert [r.getMessage() for r in caplog.records] == ["[Task: mine] something else"]
    target = io.StringIO()
    stream = _WithoutBootstrapLines(target)
    stream.write("kept 1\nbootstrapping for stddev: perplexity\nkept")
    stream.write(" 2\n")
    stream.flush()
    assert target.getvalue() == "kept 1\nkept 2\n"

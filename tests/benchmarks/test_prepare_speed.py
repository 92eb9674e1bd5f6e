"""benchmarks/prepare_speed.py at a tiny size, run as a user runs it: its plain loop writes the
same tokens as prepare (the script checks it), and the JSON holds both sides, the ratio and
the hours for 100 B tokens."""

from __future__ import annotations

import json
import subprocess
import sys

from harness import REPO


def test_the_benchmark_runs_and_compares_like_with_like(tmp_path):
    out = tmp_path / "prepare_speed.json"
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "prepare_speed.py"), "--corpus-mb", "0.4",
                           "--val-fraction", "0.2", "--repeats", "2", "--vocab-size", "300", "--out", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(out.read_text())
    assert [s["repeat"] for s in result["samples"]["prepare"]] == [0, 1]
    assert result["prepare"]["tokens"] == result["plain"]["tokens"] > 10_000
    assert result["ratio_cpu"] > 0 and set(result["hours_for_100B"]) == {"1", "8", "32"}
    assert result["environment"]["rayon_num_threads"] == "1" and "| prepare |" in done.stdout

"""benchmarks/mixture_speed.py at a tiny size, run as a user runs it: both halves prepared with
one tokenizer, both loaders timed for 0 and 2 workers over whole blocks, ratios in the JSON."""

from __future__ import annotations

import json
import subprocess
import sys

from harness import REPO


def test_the_benchmark_times_both_loaders_over_whole_blocks(tmp_path):
    out = tmp_path / "mixture_speed.json"
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "mixture_speed.py"), "--data-root",
                           str(tmp_path / "data"), "--max-tokens", "60k", "--batches", "10", "--reps", "1",
                           "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(out.read_text())
    from framework.training.data.mixture_loader import BLOCK

    assert result["batches"] == BLOCK  # 10 rounded up to one whole block
    assert [row["workers"] for row in result["rows"]] == [0, 2]
    for row in result["rows"]:
        assert len(row["samples"]["one folder"]) == len(row["samples"]["mixture"]) == 1
        assert row["ratio_wall"] == row["mixture_tokens_per_s"] / row["one_folder_tokens_per_s"] > 0
    manifests = [json.loads((tmp_path / "data" / half / "manifest.json").read_text()) for half in ("code", "prose")]
    assert manifests[0]["tokenizer"]["sha256"] == manifests[1]["tokenizer"]["sha256"]
    assert "| 2 |" in done.stdout

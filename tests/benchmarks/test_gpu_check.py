"""benchmarks/gpu_check.sh's 20-TPP core subset, dry-run on the CPU (SMOKE=1): the one device
call the day a GPU is lent runs exactly these six runs of recipes/sweeps/paper-gpu.yaml at the
paper's budget, and an unknown run name is refused."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CORE = {"dense,seed=0", "dense,seed=1", "ild-dts-0.4,seed=0", "ild-dts-0.4,seed=1", "ild-its-0.8,seed=0",
        "ild-dts-0.8-r1,seed=0"}


def gpu_check(tmp_path: Path, runs: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "SMOKE": "1", "RUNS": runs, "PYTHON": sys.executable, "OUT": str(tmp_path / "out"),
           "GPU_DATA": str(tmp_path / "no-data")}
    return subprocess.run(["bash", str(REPO / "benchmarks" / "gpu_check.sh")], capture_output=True, text=True,
                          env=env, cwd=REPO, timeout=300)


def test_the_core_subset_is_six_runs_at_20_tokens_per_parameter(tmp_path):
    done = gpu_check(tmp_path, "paper-gpu-core")
    assert done.returncode == 0, done.stdout + done.stderr
    rows = {m.group(1): m.group(2) for m in re.finditer(r"^(\S+,seed=\d)\s.*?\s([\d.]+)\s+pending$", done.stdout, re.M)}
    assert set(rows) == CORE
    assert {float(tpp) for tpp in rows.values()} == {20.0}      # 3,892 × 40 × 128 tokens / 996,224
    assert (tmp_path / "out" / "paper-gpu-core.log").is_file()
    assert not (tmp_path / "no-data").exists()                  # no throughput run: nothing prepared


def test_an_unknown_run_is_named(tmp_path):
    done = gpu_check(tmp_path, "paper-gpu-cor")
    assert "unknown run 'paper-gpu-cor'" in done.stderr

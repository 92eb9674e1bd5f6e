"""benchmarks/gpu_check.sh's 20-TPP core subset, dry-run on the CPU (SMOKE=1): the one device
call the day a GPU is lent runs exactly these six runs of recipes/sweeps/paper-gpu.yaml at the
paper's budget; its decoding run writes tokens/s for both modes at batch 1 and 8; an unknown run name
is refused before anything runs."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import json
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


def test_the_lambda_subset_brackets_the_p20_rows_of_the_core_at_20_tokens_per_parameter(tmp_path):
    done = gpu_check(tmp_path, "paper-gpu-lambda")
    assert done.returncode == 0, done.stdout + done.stderr
    rows = {m.group(1): m.group(2) for m in re.finditer(r"^(\S+,seed=\d)\s.*?\s([\d.]+)\s+pending$", done.stdout, re.M)}
    assert set(rows) == {f"{name}-tau-{tau},seed=0" for name in ("ild-its-0.8", "ild-dts-0.8-r1") for tau in (0.26, 0.78)}
    assert {float(tpp) for tpp in rows.values()} == {20.0}
    assert {name.split("-tau-")[0] + ",seed=0" for name in rows} <= CORE  # the core's rows, at other τ_EMA
    assert (tmp_path / "out" / "paper-gpu-lambda.log").is_file()
    assert not (tmp_path / "no-data").exists()                  # no throughput run: nothing prepared


def test_an_unknown_run_is_refused_in_one_line_before_any_work(tmp_path):
    done = gpu_check(tmp_path, "decode paper-gpu-cor")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("error: unknown run 'paper-gpu-cor' in RUNS (known: ") and done.stderr.count("\n") == 1
    assert not (tmp_path / "no-data").exists() and not (tmp_path / "out").exists()  # no data, not even decode ran


def test_the_decoding_run_writes_both_modes_at_batch_1_and_8_without_preparing_data(tmp_path):
    done = gpu_check(tmp_path, "decode")
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads((tmp_path / "out" / "decoding.json").read_text())
    assert {(row["mode"], row["batch"]) for row in result["rows"]} == {("full", 1), ("full", 8), ("exit:2", 1),
                                                                          ("exit:2", 8)}
    assert all(row["tokens_per_s"] > 0 for row in result["rows"]) and result["compiled"] is False
    assert not (tmp_path / "no-data").exists()

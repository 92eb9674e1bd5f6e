"""recipes/launch/: what the SLURM and torchrun scripts hand to `layerdrop pretrain`
(a stub `srun` records it), and their errors. The real torchrun path is exercised
end to end by test_multinode_launch.py."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from pretrain_launch import REPO

SBATCH = REPO / "recipes" / "launch" / "slurm.sbatch"
TORCHRUN = REPO / "recipes" / "launch" / "torchrun.sh"


def _stub(bin_dir: Path, name: str) -> Path:
    """An executable ``name`` that writes its arguments, one per line, to <bin>/<name>.args."""
    bin_dir.mkdir(exist_ok=True)
    record = bin_dir / f"{name}.args"
    stub = bin_dir / name
    stub.write_text(f'#!/usr/bin/env bash\nprintf "%s\\n" "$@" > "{record}"\n')
    stub.chmod(0o755)
    return record


def _run(script: Path, args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    return subprocess.run(["bash", str(script), *args], env={**base, **env}, capture_output=True, text=True,
                          timeout=30)


def _option(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


@pytest.mark.parametrize("tasks, expected", [("8", "8"), ("4(x3)", "4")])
def test_sbatch_takes_nodes_and_gpus_from_the_allocation(tmp_path, tasks, expected):
    record = _stub(tmp_path / "bin", "srun")
    result = _run(SBATCH, ["recipes/3.9b.yaml", "--trainer.max_steps", "7"],
                  {"PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", "SLURM_JOB_NUM_NODES": "3",
                   "SLURM_NTASKS_PER_NODE": tasks, "STRATEGY": "deepspeed_stage_3"})
    assert result.returncode == 0, result.stderr
    args = record.read_text().splitlines()
    assert args[:5] == ["--kill-on-bad-exit=1", "layerdrop", "pretrain", "--config", "recipes/3.9b.yaml"]
    assert _option(args, "--trainer.devices") == expected and _option(args, "--trainer.num_nodes") == "3"
    assert _option(args, "--trainer.strategy") == "deepspeed_stage_3"
    assert _option(args, "--trainer.precision") == "bf16-mixed" and _option(args, "--resume") == "auto"
    assert args[-2:] == ["--trainer.max_steps", "7"]  # the user's overrides come last and win


@pytest.mark.parametrize("nodes, strategy", [("3", "hsdp"), ("1", "fsdp")])
def test_sbatch_defaults_to_hsdp_across_nodes_and_fsdp_on_one(tmp_path, nodes, strategy):
    record = _stub(tmp_path / "bin", "srun")
    result = _run(SBATCH, ["recipes/3.9b.yaml"], {"PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}",
                                                  "SLURM_JOB_NUM_NODES": nodes, "SLURM_NTASKS_PER_NODE": "8"})
    assert result.returncode == 0, result.stderr
    assert _option(record.read_text().splitlines(), "--trainer.strategy") == strategy


def test_sbatch_outside_slurm_is_an_error(tmp_path):
    result = _run(SBATCH, ["recipes/tiny.yaml"], {})
    assert result.returncode != 0 and "run this through sbatch" in result.stderr


def test_torchrun_script_forwards_the_layout(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("{}")
    record = _stub(tmp_path / "bin", "fakepython")
    result = _run(TORCHRUN, [str(recipe), "--resume", "auto"],
                  {"PYTHON": str(tmp_path / "bin" / "fakepython"), "NNODES": "4", "NODE_RANK": "2",
                   "MASTER_ADDR": "node0", "GPUS_PER_NODE": "8"})
    assert result.returncode == 0, result.stderr
    args = record.read_text().splitlines()
    assert args[:2] == ["-m", "torch.distributed.run"]
    assert [_option(args, k) for k in ("--nnodes", "--node-rank", "--nproc-per-node", "--master-addr")] == \
        ["4", "2", "8", "node0"]
    assert [_option(args, k) for k in ("--trainer.devices", "--trainer.num_nodes", "--trainer.strategy",
                                       "--trainer.precision")] == ["8", "4", "hsdp", "bf16-mixed"]
    assert args[-2:] == ["--resume", "auto"]


def test_torchrun_script_on_one_node_defaults_to_fsdp(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("{}")
    record = _stub(tmp_path / "bin", "fakepython")
    result = _run(TORCHRUN, [str(recipe)], {"PYTHON": str(tmp_path / "bin" / "fakepython"), "GPUS_PER_NODE": "8"})
    assert result.returncode == 0, result.stderr
    assert _option(record.read_text().splitlines(), "--trainer.strategy") == "fsdp"


@pytest.mark.parametrize("args, message", [([], "usage:"), (["missing.yaml"], "recipe 'missing.yaml' does not exist")])
def test_torchrun_script_errors(args, message):
    result = _run(TORCHRUN, args, {"GPUS_PER_NODE": "1"})
    assert result.returncode == 2 and message in result.stderr

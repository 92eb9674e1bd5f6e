"""Fixtures of the multi-process tests: tiny prepared data, made once per test session
and shared between pytest-xdist workers."""

from __future__ import annotations

from pathlib import Path

import pytest

from pretrain_launch import ddp_reference_recipe, launch_nodes, nodes_recipe, pretrain_command, run, shared_once

FSDP2_FP32 = {"class_path": "framework.strategies.FSDP2Strategy", "init_args": {"param_dtype": "float32"}}
ZERO2 = {"class_path": "cpu_deepspeed.CPUDeepSpeedStrategy", "init_args": {"stage": 2}}


@pytest.fixture(scope="session")
def tiny_data(prepared_tokens: Path) -> Path:
    return prepared_tokens  # tests/conftest.py: the suite's one prepared data folder


@pytest.fixture(scope="session")
def ddp_run(shared_dir: Path, tiny_data: Path) -> Path:
    """The DDP reference run (made once per session; other strategies compare with it)."""

    def train(out: Path) -> None:
        run(pretrain_command(ddp_reference_recipe(out, tiny_data)), out / "log.txt")

    return shared_once(shared_dir, "ddp-run", train)


@pytest.fixture(scope="session")
def nodes_ddp_run(shared_dir: Path, tiny_data: Path) -> Path:
    """DDP over two torchrun "nodes" of two processes each (made once per session)."""
    return shared_once(shared_dir, "nodes-ddp-run",
                       lambda out: launch_nodes(nodes_recipe(out, tiny_data, "ddp"), out, devices=2, strategy="ddp"))



def _sharded_run(shared_dir: Path, tiny_data: Path, name: str, strategy) -> Path:
    """The DDP reference run's recipe under another strategy, with the live model's
    logits at the end; no checkpoint before the last."""
    def train(out: Path) -> None:
        recipe = ddp_reference_recipe(out, tiny_data, strategy=strategy, every_n_steps=1000,
                                      logits_out=out / "logits.pt")
        run(pretrain_command(recipe), out / "log.txt")

    return shared_once(shared_dir, name, train)


# test_early_exit_loss_ranks.py compares these with ddp_run step by step; they are also
# the sharded checkpoint forms test_checkpoint_forms.py reads.
@pytest.fixture(scope="session")
def fsdp2_fp32_run(shared_dir: Path, tiny_data: Path) -> Path:
    return _sharded_run(shared_dir, tiny_data, "fsdp2-fp32-run", FSDP2_FP32)


@pytest.fixture(scope="session")
def zero2_run(shared_dir: Path, tiny_data: Path) -> Path:
    return _sharded_run(shared_dir, tiny_data, "zero2-run", ZERO2)

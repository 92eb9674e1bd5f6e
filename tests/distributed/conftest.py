"""Fixtures of the multi-process tests: tiny prepared data, made once per test session
and shared between pytest-xdist workers."""

from __future__ import annotations

from pathlib import Path

import pytest

from pretrain_launch import ddp_reference_recipe, launch_nodes, nodes_recipe, pretrain_command, run, shared_once


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

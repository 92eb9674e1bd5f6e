"""One real single-device `layerdrop pretrain` run shared by the checkpoint tests
(export, tokenizer), made once per test session even across pytest-xdist workers.

It is started as a user would, from the folder holding its data: the data folder and
the run folder are given as relative paths. Tests must not change it (copy instead).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch
from filelock import FileLock

from tiny_training import prepare_tiny_data, tiny_cli_args


def pretrained_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """<root>/data (prepared), <root>/run (2 steps: checkpoints/, export/)."""
    from framework.pretrain import main as pretrain

    base = tmp_path_factory.getbasetemp()
    shared = base.parent if base.name.startswith("popen-gw") else base
    root = shared / "checkpoint-run"
    with FileLock(str(shared / "checkpoint-run.lock")):
        if not (root / ".done").exists():
            shutil.rmtree(root, ignore_errors=True)
            root.mkdir()
            before = os.getcwd()
            os.chdir(root)
            try:
                prepare_tiny_data("data")
                assert pretrain(tiny_cli_args("data", "run", steps=2) + ["--trainer.logger", "false"]) == 0
            finally:
                os.chdir(before)
            (root / ".done").touch()
    return root


def moved_copy(checkpoint: Path, target: Path, data_dir: Path) -> Path:
    """A copy of a single-file checkpoint as if its run's data now lived in ``data_dir``."""
    content = torch.load(checkpoint.resolve(), map_location="cpu", weights_only=True)
    content["layerdrop"]["data_dir"] = str(data_dir)
    content["datamodule_hyper_parameters"]["data_dir"] = str(data_dir)
    target.parent.mkdir(parents=True, exist_ok=True)
    torch.save(content, target)
    return target

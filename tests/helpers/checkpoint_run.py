"""One real single-device `layerdrop pretrain` run shared by the checkpoint tests
(export, tokenizer), made once per test session even across pytest-xdist workers.

It is started as a user would, from the folder holding its data: the data folder (a
copy of the suite's prepared tokens) and the run folder are given as relative paths.
Tests must not change it (copy instead).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch

from tests.helpers.tiny_training import shared_once, tiny_cli_args


def pretrained_run(shared_dir: Path, prepared_tokens: Path) -> Path:
    """<root>/data, <root>/run (2 steps: checkpoints/, export/)."""
    from framework.training.pretrain import main as pretrain

    def make(root: Path) -> None:
        shutil.copytree(prepared_tokens, root / "data")
        before = os.getcwd()
        os.chdir(root)
        try:
            assert pretrain(tiny_cli_args("data", "run", steps=2) + ["--trainer.logger", "false"]) == 0
        finally:
            os.chdir(before)

    return shared_once(shared_dir, "checkpoint-run", make)


def moved_copy(checkpoint: Path, target: Path, data_dir: Path) -> Path:
    """A copy of a single-file checkpoint as if its run's data now lived in ``data_dir``."""
    content = torch.load(checkpoint.resolve(), map_location="cpu", weights_only=True)
    content["layerdrop"]["data_dir"] = str(data_dir)
    content["datamodule_hyper_parameters"]["data_dir"] = str(data_dir)
    target.parent.mkdir(parents=True, exist_ok=True)
    torch.save(content, target)
    return target


def count_checkpoint_opens(monkeypatch) -> list[Path]:
    """The paths a command opens as checkpoints from now on (finding the form is the
    first read of every open; an opened ``Checkpoint`` handed on is not counted)."""
    import framework.checkpoint.loader as loader

    opened, form_of = [], loader.form_of

    def counted(path):
        opened.append(Path(path))
        return form_of(path)
    monkeypatch.setattr(loader, "form_of", counted)
    return opened

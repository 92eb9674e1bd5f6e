"""A data mixture under DDP on 2 CPU processes (gloo): each rank draws its own sources and
streams its own share of each folder; summary.json's per-source tokens add up both ranks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.distributed.pretrain_launch import MICRO_BATCH, SEQ_LEN, pretrain_command, run, tiny_recipe

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(900)]
STEPS = 12


def test_ddp_mixture_counts_both_ranks_tokens_per_source(tmp_path: Path, mixture_sources):
    recipe = tiny_recipe(tmp_path / "recipe.json", data_dir=Path(mixture_sources["email"]), root=tmp_path / "run",
                         strategy="ddp", steps=STEPS, p_max=0.5)
    settings = json.loads(recipe.read_text())
    settings["data"].pop("data_dir")
    settings["data"]["mixture"] = {"email": {"dir": mixture_sources["email"], "weight": 0.6},
                                   "http": {"dir": mixture_sources["http"], "weight": 0.4}}
    recipe.write_text(json.dumps(settings))
    run(pretrain_command(recipe), tmp_path / "log.txt")
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    tokens = {name: source["tokens"] for name, source in summary["data"]["sources"].items()}
    assert sum(tokens.values()) == summary["tokens"] == STEPS * MICRO_BATCH * SEQ_LEN * 2  # both ranks
    assert all(count > 0 and count % SEQ_LEN == 0 for count in tokens.values())
    assert all(isinstance(source["val_loss"], float) for source in summary["data"]["sources"].values())

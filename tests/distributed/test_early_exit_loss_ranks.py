"""The early-exit loss under DDP and FSDP2 on 2 CPU processes (gloo), with layer dropout.

The exits a step trains are a function of the step alone, so every rank adds the same
exit heads (no rank skips a head call its peer makes, which would hang FSDP2's
all-gather or break DDP's reduction). The two strategies run the same recipe on the
same data and masks: their per-rank objectives agree step by step, which they would not
if either rank had computed other exits. (Their weights are not compared: AdamW turns
the rounding noise of gradients that are zero in exact arithmetic, such as the key bias's,
into updates of ±lr.)
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from framework.config import EarlyExitLossConfig
from framework.early_exit_loss import active_exits
from pretrain_launch import LAYERS, pretrain_command, read_ranks, run, shared_once, tiny_recipe

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(900)]

STEPS = 12
EXITS = {"scale": 0.5, "curriculum": "rotational", "weighting": "linear"}  # exits 1, 2, 3: {1, 3}, {2}, ...


def recipe(out: Path, data: Path, strategy) -> Path:
    return tiny_recipe(out / "recipe.json", data_dir=data, root=out / "run", strategy=strategy, steps=STEPS,
                       p_max=0.5, distribution="increasing", schedule="constant", probe_dir=out / "probe",
                       save_parameters=True, val_check_interval=STEPS, early_exit_loss=EXITS)


@pytest.fixture(scope="module")
def ddp_exit_run(shared_dir: Path, tiny_data: Path) -> Path:
    return shared_once(shared_dir, "ddp-early-exit-run",
                       lambda out: run(pretrain_command(recipe(out, tiny_data, "ddp")), out / "log.txt"))


@pytest.fixture(scope="module")
def fsdp_exit_run(shared_dir: Path, tiny_data: Path) -> Path:
    strategy = {"class_path": "framework.strategies.FSDP2Strategy", "init_args": {"param_dtype": "float32"}}
    return shared_once(shared_dir, "fsdp-early-exit-run",
                       lambda out: run(pretrain_command(recipe(out, tiny_data, strategy)), out / "log.txt"))


def test_ddp_trains_with_the_early_exit_loss_and_keeps_identical_replicas(ddp_exit_run):
    ranks = read_ranks(ddp_exit_run / "probe", 2)
    for rank in ranks:
        assert rank["strategy"] == "DDPStrategy"
        assert [s["step"] for s in rank["steps"]] == list(range(1, STEPS + 1))
        assert all(math.isfinite(s["loss"]) and len(s["rows_per_call"]) == LAYERS for s in rank["steps"])
        last = active_exits(EarlyExitLossConfig(**EXITS), LAYERS, STEPS - 1, STEPS)  # the last logged step
        assert sorted(k for k in rank["logged"] if k.startswith("early_exit/")) == \
            sorted({f"early_exit/loss_{k}" for k in (1, 2, 3)})  # every exit was logged at some step
        assert all(math.isfinite(rank["logged"][f"early_exit/loss_{k}"]) for k in last)
    assert [s["rows_per_call"] for s in ranks[0]["steps"]] != [s["rows_per_call"] for s in ranks[1]["steps"]]
    first, second = (torch.load(ddp_exit_run / "probe" / f"parameters-rank{r}.pt", weights_only=True) for r in (0, 1))
    for name in first:
        assert torch.equal(first[name], second[name]), name
    summary = json.loads((ddp_exit_run / "run" / "summary.json").read_text())
    assert summary["early_exit_loss"]["scale"] == 0.5
    assert summary["early_exit_loss"]["val_loss"].keys() == {"1", "2", "3"}
    assert all(math.isfinite(v) for v in summary["early_exit_loss"]["val_loss"].values())


def test_fsdp2_runs_the_same_exits_as_ddp_step_by_step(ddp_exit_run, fsdp_exit_run):
    for ddp, fsdp in zip(read_ranks(ddp_exit_run / "probe", 2), read_ranks(fsdp_exit_run / "probe", 2)):
        assert fsdp["strategy"] == "FSDP2Strategy"
        assert [s["rows_per_call"] for s in fsdp["steps"]] == [s["rows_per_call"] for s in ddp["steps"]]
        assert [s["loss"] for s in fsdp["steps"]] == pytest.approx([s["loss"] for s in ddp["steps"]], rel=1e-4)
        exits = {k: v for k, v in ddp["logged"].items() if k.startswith("early_exit/")}
        assert {k: v for k, v in fsdp["logged"].items() if k.startswith("early_exit/")} == pytest.approx(exits, rel=1e-4)

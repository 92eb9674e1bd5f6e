"""The early-exit loss under DDP, FSDP2 and ZeRO-2 on 2 CPU processes (gloo), with layer
dropout.

The exits a step trains are a function of the step alone, so every rank adds the same
exit heads (no rank skips a head call its peer makes, which would hang FSDP2's
all-gather or break DDP's reduction). The three strategies run the same recipe on the
same data and masks (the DDP reference run's, tests/distributed/pretrain_launch.py, at
uniform p_max = 0.99: nearly every block call is on zero rows): their per-rank
objectives agree step by step, which they would not if any rank had computed other
exits. (Their weights are not compared: AdamW turns the rounding noise of gradients that
are zero in exact arithmetic, such as the key bias's, into updates of ±lr.)
"""

from __future__ import annotations

import json
import math

import pytest

from framework.config import EarlyExitLossConfig
from framework.early_exit_loss import active_exits
from pretrain_launch import EXITS, LAYERS, STEPS, read_ranks

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(900)]


def test_ddp_trains_and_validates_every_exit(ddp_run):
    """(Steps, finite losses, identical replicas and per-rank masks of this run:
    test_ddp_layer_dropout.py.)"""
    for rank in read_ranks(ddp_run / "probe", 2):
        assert rank["strategy"] == "DDPStrategy"
        last = active_exits(EarlyExitLossConfig(**EXITS), LAYERS, STEPS - 1, STEPS)  # the last logged step
        assert sorted(k for k in rank["logged"] if k.startswith("early_exit/")) == \
            sorted({f"early_exit/loss_{k}" for k in (1, 2, 3)})  # every exit was logged at some step
        assert all(math.isfinite(rank["logged"][f"early_exit/loss_{k}"]) for k in last)
    summary = json.loads((ddp_run / "run" / "summary.json").read_text())
    assert summary["early_exit_loss"]["scale"] == 0.5
    assert summary["early_exit_loss"]["val_loss"].keys() == {"1", "2", "3"}
    assert all(math.isfinite(v) for v in summary["early_exit_loss"]["val_loss"].values())


@pytest.mark.parametrize("run,strategy", [("fsdp2_fp32_run", "FSDP2Strategy"), ("zero2_run", "CPUDeepSpeedStrategy")])
def test_sharded_strategies_run_the_same_exits_as_ddp_step_by_step(ddp_run, run, strategy, request):
    sharded_run = request.getfixturevalue(run)
    for ddp, sharded in zip(read_ranks(ddp_run / "probe", 2), read_ranks(sharded_run / "probe", 2)):
        assert sharded["strategy"] == strategy and sharded["world_size"] == 2
        assert [s["step"] for s in sharded["steps"]] == list(range(1, STEPS + 1))
        # Masks depend on (seed, rank, step, micro-batch, layer) only: the strategy changes none.
        assert [s["rows_per_call"] for s in sharded["steps"]] == [s["rows_per_call"] for s in ddp["steps"]]
        assert [s["loss"] for s in sharded["steps"]] == pytest.approx([s["loss"] for s in ddp["steps"]], rel=1e-4)
        exits = {k: v for k, v in ddp["logged"].items() if k.startswith("early_exit/")}
        assert {k: v for k, v in sharded["logged"].items() if k.startswith("early_exit/")} == \
            pytest.approx(exits, rel=1e-4)
    summary = json.loads((sharded_run / "run" / "summary.json").read_text())
    reference = json.loads((ddp_run / "run" / "summary.json").read_text())
    assert summary["flops_saved_pct"] == pytest.approx(reference["flops_saved_pct"], rel=1e-9)
    assert summary["checkpoint"] and (sharded_run / "run" / "checkpoints" / "last.ckpt").exists()

"""`layerdrop pretrain` under DeepSpeed ZeRO-3 on 2 CPU processes: the DDP reference
run's recipe (uniform p_max = 0.99, the early-exit loss on).

Lightning's DeepSpeedStrategy is CUDA-only, so the recipe names the test-only
``cpu_deepspeed.CPUDeepSpeedStrategy`` (its CUDA checks lifted, gloo) as a class path:
the same LightningCLI route a user's own strategy class takes. ZeRO-3 gathers each
block's parameters in the block's forward hooks, like FSDP2, so it needs every rank to
call every block, and every exit head the other calls. ZeRO-2 shards gradients and
optimizer state and must compute what DDP computes: its run (conftest.py) is compared
with DDP's step by step in test_early_exit_loss_ranks.py.
"""

from __future__ import annotations

import json
import math

import pytest

from pretrain_launch import LAYERS, STEPS, ddp_reference_recipe, pretrain_command, read_ranks, run

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(900)]

ZERO3 = {"class_path": "cpu_deepspeed.CPUDeepSpeedStrategy", "init_args": {"stage": 3}}


def test_zero3_trains_with_layer_dropout_at_p_max_099_and_the_early_exit_loss(ddp_run, tiny_data, tmp_path):
    recipe = ddp_reference_recipe(tmp_path, tiny_data, strategy=ZERO3, every_n_steps=1000)
    run(pretrain_command(recipe), tmp_path / "log.txt")
    ranks, ddp_ranks = read_ranks(tmp_path / "probe", 2), read_ranks(ddp_run / "probe", 2)
    for rank in ranks:
        assert rank["strategy"] == "CPUDeepSpeedStrategy" and rank["world_size"] == 2
        assert [s["step"] for s in rank["steps"]] == list(range(1, STEPS + 1))
        assert all(math.isfinite(s["loss"]) for s in rank["steps"])
        assert all(len(s["rows_per_call"]) == LAYERS for s in rank["steps"])
    # Masks depend on (seed, rank, step, micro-batch, layer) only: the strategy changes none.
    for zero, ddp in zip(ranks, ddp_ranks):
        assert [s["rows_per_call"] for s in zero["steps"]] == [s["rows_per_call"] for s in ddp["steps"]]
        exits = sorted(k for k in ddp["logged"] if k.startswith("early_exit/"))
        assert sorted(k for k in zero["logged"] if k.startswith("early_exit/")) == exits
        assert all(math.isfinite(zero["logged"][k]) for k in exits)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    reference = json.loads((ddp_run / "run" / "summary.json").read_text())
    assert summary["flops_saved_pct"] == pytest.approx(reference["flops_saved_pct"], rel=1e-9)
    assert summary["checkpoint"] and (tmp_path / "run" / "checkpoints" / "last.ckpt").exists()
    losses = [s["loss"] for s in ranks[0]["steps"]]
    ddp_losses = [s["loss"] for s in ddp_ranks[0]["steps"]]
    # ZeRO-3 builds the model already partitioned, which draws the initial weights in
    # another order than DDP does: the run must learn, not match. Its first loss
    # must still be that of the same init (Table A.2's σ): writing to partitioned
    # placeholders would silently keep nn.Linear's default init (in a run without the
    # early-exit loss: first loss 13.3 against DDP's 5.96).
    assert losses[0] == pytest.approx(ddp_losses[0], abs=0.3)
    assert sum(losses[-5:]) < sum(losses[:5])

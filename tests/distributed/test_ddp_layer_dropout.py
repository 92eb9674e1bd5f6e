"""`layerdrop pretrain` under DDP on 2 CPU processes (gloo) at p_max = 0.99.

At p_max = 0.99 nearly every block runs on zero rows on nearly every step, which is
what hangs naive layer dropout under data parallelism (a rank that skips a block
skips its gradient all-reduce). Here every rank calls every block every step, so
the run completes, the replicas stay identical, the masks differ per rank, the FLOPs
saved match P̄, and a run resumed from a mid-run checkpoint retraces the original.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch

from pretrain_launch import LAYERS, P_MAX, STEPS, ddp_reference_recipe, pretrain_command, read_ranks, run

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(900)]


def test_ddp_finishes_with_finite_losses_and_every_block_called_every_step(ddp_run):
    for rank in read_ranks(ddp_run / "probe", 2):
        assert rank["world_size"] == 2 and rank["strategy"] == "DDPStrategy"
        assert [s["step"] for s in rank["steps"]] == list(range(1, STEPS + 1))
        losses = [s["loss"] for s in rank["steps"]]
        assert all(math.isfinite(loss) for loss in losses)
        assert sum(losses[-5:]) < sum(losses[:5])  # it trains (embedding and head, mostly)
        calls = [s["rows_per_call"] for s in rank["steps"]]
        assert all(len(c) == LAYERS for c in calls)  # every block, every step
        assert sum(rows == 0 for c in calls for rows in c) > 0.9 * STEPS * LAYERS  # mostly zero-row calls


def test_ddp_replicas_stay_identical(ddp_run):
    first, second = (torch.load(ddp_run / "probe" / f"parameters-rank{r}.pt", weights_only=True) for r in (0, 1))
    assert first.keys() == second.keys()
    for name in first:
        assert torch.equal(first[name], second[name]), name


def test_ddp_ranks_draw_different_masks(ddp_run):
    ranks = read_ranks(ddp_run / "probe", 2)
    masks = [[s["rows_per_call"] for s in rank["steps"]] for rank in ranks]
    assert masks[0] != masks[1]
    # Kept rows are Binomial(4, 0.01) per block call: the ranks keep rows on different calls.
    kept = [{(t, layer) for t, calls in enumerate(m) for layer, rows in enumerate(calls) if rows} for m in masks]
    assert kept[0] and kept[1] and kept[0] != kept[1]


def test_ddp_logged_flops_saving_matches_mean_dropout(ddp_run):
    """P̄ = 0.99; the realised saving is a Binomial mean over 30·4·4 row-layers per rank
    (sd 0.45 percentage points per rank, 0.32 over both): allow 5 sd."""
    for rank in read_ranks(ddp_run / "probe", 2):
        assert rank["logged"]["flops/saved_pct"] == pytest.approx(100 * P_MAX, abs=5 * 0.45)
    summary = json.loads((ddp_run / "run" / "summary.json").read_text())
    assert summary["mean_dropout_predicted"] == pytest.approx(P_MAX)
    assert summary["flops_saved_pct"] == pytest.approx(100 * P_MAX, abs=5 * 0.32)
    # The global figure is the mean of the two devices' (equal dense FLOPs per device).
    per_rank = [r["logged"]["flops/saved_pct"] for r in read_ranks(ddp_run / "probe", 2)]
    assert summary["flops_saved_pct"] == pytest.approx(sum(per_rank) / 2, rel=1e-4)


def test_ddp_resume_from_a_mid_run_checkpoint_retraces_the_run(ddp_run, tmp_path):
    """The process ended after step 15's checkpoint; a new one resumes from it and must
    repeat steps 16..30 exactly: weights, optimizer, LR, data position and masks."""
    halfway = tmp_path / "step-00000015.ckpt"
    shutil.copy(ddp_run / "run" / "checkpoints" / "step-00000015.ckpt", halfway)
    data = Path(json.loads((ddp_run / "recipe.json").read_text())["data"]["data_dir"])
    recipe = ddp_reference_recipe(tmp_path, data)
    run(pretrain_command(recipe, "--resume", str(halfway)), tmp_path / "log.txt")
    for straight, resumed in zip(read_ranks(ddp_run / "probe", 2), read_ranks(tmp_path / "probe", 2)):
        tail = straight["steps"][STEPS // 2:]
        assert [s["step"] for s in resumed["steps"]] == [s["step"] for s in tail]
        assert [s["rows_per_call"] for s in resumed["steps"]] == [s["rows_per_call"] for s in tail]
        assert [s["loss"] for s in resumed["steps"]] == pytest.approx([s["loss"] for s in tail], rel=1e-6)
    for rank in (0, 1):
        final = torch.load(tmp_path / "probe" / f"parameters-rank{rank}.pt", weights_only=True)
        reference = torch.load(ddp_run / "probe" / f"parameters-rank{rank}.pt", weights_only=True)
        for name in reference:
            torch.testing.assert_close(final[name], reference[name], rtol=1e-5, atol=1e-6, msg=name)
    # The run's FLOP account continues across the resume on every device.
    straight_summary = json.loads((ddp_run / "run" / "summary.json").read_text())
    resumed_summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert resumed_summary["flops_saved_pct"] == pytest.approx(straight_summary["flops_saved_pct"], rel=1e-9)
    assert resumed_summary["tokens"] == straight_summary["tokens"]

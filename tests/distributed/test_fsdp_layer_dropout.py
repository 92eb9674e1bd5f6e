"""FSDP2 on 2 CPU processes: `fully_shard` per block, then the root (our FSDP2Strategy, a
Lightning ModelParallelStrategy), with activation checkpointing, at p_max = 0.99
increasing over depth (ILD), and the GPU mixed-precision policy asked for on CPU
(the recipe names the strategy class with ``param_dtype: bfloat16``; gloo all-gathers
bf16): bf16 all-gathers and compute, float32 reduce-scatters, master weights and
AdamW state.

FSDP2 all-gathers a block's shards in the block's pre-forward hook: a rank that
skipped a dropped block would leave its peer waiting in that all-gather forever
(pytorch #152964). Every block is called on every step here, on zero rows when all
sequences drop it, so 30 steps finish within the launch time-out.
"""

from __future__ import annotations

import json
import math
import shutil
from collections import Counter
from pathlib import Path

import pytest

from benchmarks.comm_volume import (expected_calls, micro_batch_collectives, optimizer_step_collectives,
                                     recorded_calls)
from pretrain_launch import (LAYERS, MICRO_BATCH, P_MAX, SEQ_LEN, STEPS, VOCAB, pretrain_command, read_ranks, run,
                             shared_once, tiny_recipe)

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(600)]

ILD_RATES = [P_MAX * layer / (LAYERS - 1) for layer in range(LAYERS)]  # 0, .33, .66, .99
MEAN_DROPOUT = sum(ILD_RATES) / LAYERS  # P̄ = p_max / 2 for a constant ILD schedule


def _saved_fraction_sd(row_layers: int) -> float:
    """Standard deviation of the realised saving: (1/L)·mean over layers of Bernoulli drops."""
    return math.sqrt(sum(p * (1 - p) for p in ILD_RATES) / LAYERS**2 / row_layers)


BF16_FSDP2 = {"class_path": "framework.strategies.FSDP2Strategy",
              "init_args": {"param_dtype": "bfloat16", "reduce_dtype": "float32"}}


def fsdp_recipe(out: Path, data: Path) -> Path:
    return tiny_recipe(out / "recipe.json", data_dir=data, root=out / "run", strategy=BF16_FSDP2, steps=STEPS,
                       p_max=P_MAX, distribution="increasing", schedule="constant", probe_dir=out / "probe",
                       activation_checkpointing=True, every_n_steps=STEPS // 2, val_check_interval=STEPS // 2,
                       record_collectives=True)


@pytest.fixture(scope="module")
def fsdp_run(shared_dir: Path, tiny_data: Path) -> Path:
    return shared_once(shared_dir, "fsdp-run",
                       lambda out: run(pretrain_command(fsdp_recipe(out, tiny_data)), out / "log.txt"))


def test_fsdp_finishes_and_calls_every_block_on_every_rank_and_step(fsdp_run):
    ranks = read_ranks(fsdp_run / "probe", 2)
    for rank in ranks:
        assert rank["world_size"] == 2 and rank["strategy"] == "FSDP2Strategy"
        assert [s["step"] for s in rank["steps"]] == list(range(1, STEPS + 1))
        assert all(math.isfinite(s["loss"]) for s in rank["steps"])
        assert all(len(s["rows_per_call"]) == LAYERS for s in rank["steps"])
        # Layer 0 is never dropped (ILD); the last keeps a row 1% of the time.
        assert all(s["rows_per_call"][0] == MICRO_BATCH for s in rank["steps"])
        assert sum(s["rows_per_call"][-1] == 0 for s in rank["steps"]) >= STEPS - 3
    assert [s["rows_per_call"] for s in ranks[0]["steps"]] != [s["rows_per_call"] for s in ranks[1]["steps"]]
    # The sharded model still learns from what it ran, identically on both ranks' views.
    losses = [s["loss"] for s in ranks[0]["steps"]]
    assert sum(losses[-5:]) < sum(losses[:5])


def test_bf16_policy_gathers_and_computes_in_bf16_and_keeps_fp32_masters_and_reductions(fsdp_run):
    """The dtype of every collective of every step, and of the weights each block runs
    with, against benchmarks/comm_volume.py's arithmetic for this model and policy."""
    from framework.config import ModelConfig

    model = ModelConfig(vocab_size=VOCAB, d_model=32, n_layers=LAYERS, n_heads=4, max_seq_len=SEQ_LEN)
    rows = micro_batch_collectives(model, "fsdp", nodes=1, gpus_per_node=2, param_dtype="bfloat16",
                                   reduce_dtype="float32")
    expected = expected_calls(rows)
    assert {(op, dtype) for op, dtype, *_ in expected} == {("all_gather", "bfloat16"), ("reduce_scatter", "float32")}
    # The validation after step 15 leaves the root gathered (no backward reshards it), so
    # step 16 reuses it: one root all-gather fewer.
    root_gather = next(r for r in rows if r.unit == "root" and r.op == "all_gather")
    after_validation = expected - Counter({(root_gather.op, root_gather.dtype, root_gather.group_size,
                                            root_gather.buffer_bytes): 1})
    guard = expected_calls(optimizer_step_collectives(nodes=1, gpus_per_node=2))  # float32 flags
    for rank in read_ranks(fsdp_run / "probe", 2):
        for step in rank["steps"]:
            wanted = after_validation if step["step"] == STEPS // 2 + 1 else expected
            assert recorded_calls(step["collectives"]) == wanted + guard, (rank["rank"], step["step"])
            assert step["compute_dtypes"] == ["bfloat16"] * LAYERS  # zero-row calls included
        assert rank["parameter_dtypes"] == rank["optimizer_state_dtypes"] == ["float32"]


def test_fsdp_flops_saving_matches_mean_dropout(fsdp_run):
    sd_rank = 100 * _saved_fraction_sd(STEPS * MICRO_BATCH)
    for rank in read_ranks(fsdp_run / "probe", 2):
        assert rank["logged"]["flops/saved_pct"] == pytest.approx(100 * MEAN_DROPOUT, abs=5 * sd_rank)
    summary = json.loads((fsdp_run / "run" / "summary.json").read_text())
    assert summary["mean_dropout_predicted"] == pytest.approx(MEAN_DROPOUT)
    assert summary["flops_saved_pct"] == pytest.approx(100 * MEAN_DROPOUT, abs=5 * sd_rank / math.sqrt(2))
    assert summary["val_loss"] is not None and math.isfinite(summary["val_loss"])


@pytest.mark.slow
def test_fsdp_resume_from_a_sharded_checkpoint_retraces_the_run(fsdp_run, tiny_data, tmp_path):
    """FSDP2 checkpoints are folders of shards (torch.distributed.checkpoint); resuming
    from step 15's must repeat steps 16..30 exactly."""
    halfway = tmp_path / "step-00000015.ckpt"
    shutil.copytree(fsdp_run / "run" / "checkpoints" / "step-00000015.ckpt", halfway)
    run(pretrain_command(fsdp_recipe(tmp_path, tiny_data), "--resume", str(halfway)), tmp_path / "log.txt")
    for straight, resumed in zip(read_ranks(fsdp_run / "probe", 2), read_ranks(tmp_path / "probe", 2)):
        tail = straight["steps"][STEPS // 2:]
        assert [s["rows_per_call"] for s in resumed["steps"]] == [s["rows_per_call"] for s in tail]
        assert [s["loss"] for s in resumed["steps"]] == pytest.approx([s["loss"] for s in tail], rel=1e-6)

"""`strategy: hsdp` on two torchrun "nodes" of two CPU processes each (gloo): a 2 x 2
(replicate, shard) mesh, FSDP2 inside each node, the gradient shards all-reduced
across the nodes, at uniform p_max = 0.99 with per-device masks and the early-exit
loss on (every rank adds the same exit heads, through the root's gathered head), on
a Llama-family model (grouped-query attention, tied embeddings: pretrain_launch.LLAMA;
FSDP2 on the Celerity family is test_fsdp_layer_dropout.py's).

It must compute what DDP computes at the same global batch (test_multinode_launch.py's
run: the same 4 ranks, data and masks), move exactly the collectives
benchmarks/comm_volume.py computes, resume exactly from its sharded checkpoint, and
leave a checkpoint the eval commands load.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch

from benchmarks.comm_volume import (expected_calls, micro_batch_collectives, optimizer_step_collectives,
                                     recorded_calls)
from crash_points import read_records, skipped_line
from pretrain_launch import (LAYERS, LLAMA, MICRO_BATCH, NODES_STEPS, POISONED_STEP, SEQ_LEN, VOCAB, launch_nodes, nodes_recipe,
                             read_ranks, shared_once)

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(900)]

HALF = NODES_STEPS // 2


@pytest.fixture(scope="module")
def hsdp_run(shared_dir: Path, tiny_data: Path) -> Path:
    def train(out: Path) -> None:
        recipe = nodes_recipe(out, tiny_data, "hsdp", activation_checkpointing=True, record_collectives=True)
        launch_nodes(recipe, out, devices=2, strategy="hsdp")

    return shared_once(shared_dir, "hsdp-run", train)


def _parameters(run: Path, rank: int) -> dict[str, torch.Tensor]:
    return torch.load(run / "probe" / f"parameters-rank{rank}.pt", weights_only=True)


def test_hsdp_computes_what_ddp_computes_at_the_same_global_batch(hsdp_run, nodes_ddp_run):
    hsdp, ddp = read_ranks(hsdp_run / "probe", 4), read_ranks(nodes_ddp_run / "probe", 4)
    for sharded, replicated in zip(hsdp, ddp):
        assert sharded["strategy"] == "HSDPStrategy" and sharded["world_size"] == 4 and sharded["num_nodes"] == 2
        assert [s["step"] for s in sharded["steps"]] == list(range(1, NODES_STEPS + 1))  # no hang, every step
        # Every block is called on every step (nearly always on zero rows at p_max 0.99) with
        # the masks DDP drew on the same rank ...
        assert [s["rows_per_call"] for s in sharded["steps"]] == [s["rows_per_call"] for s in replicated["steps"]]
        assert all(len(s["rows_per_call"]) == LAYERS for s in sharded["steps"])
        # ... and the same loss, step for step (only the order of the gradient sums differs).
        assert [s["loss"] for s in sharded["steps"]] == pytest.approx([s["loss"] for s in replicated["steps"]],
                                                                       rel=1e-5)
        exits = {k: v for k, v in replicated["logged"].items() if k.startswith("early_exit/")}
        assert len(exits) == LAYERS - 1  # exits 1..3, each logged at some step
        assert {k: v for k, v in sharded["logged"].items() if k.startswith("early_exit/")} == \
            pytest.approx(exits, rel=1e-5)
    zero_row_calls = sum(rows == 0 for rank in hsdp for s in rank["steps"] for rows in s["rows_per_call"])
    assert zero_row_calls > 0.9 * 4 * NODES_STEPS * LAYERS
    # The weights after 20 steps: AdamW divides by the gradient's RMS, so on the entries
    # whose gradient is ~0 (blocks dropped on most steps) the summation-order noise
    # becomes steps of up to ~1e-5; everywhere else they agree to float precision.
    reference = _parameters(nodes_ddp_run, 0)
    for rank in range(4):
        final = _parameters(hsdp_run, rank)
        for name in reference:
            torch.testing.assert_close(final[name], reference[name], rtol=1e-4, atol=1e-4, msg=name)


def test_hsdp_ranks_agree_to_skip_a_step_only_one_of_them_saw_go_non_finite(hsdp_run):
    """nodes_recipe poisons one gradient element on rank 1 at step 2 (a DTensor shard
    here): every rank skips that step, as DDP's do (test_nonfinite_ranks.py)."""
    assert skipped_line(POISONED_STEP) in (hsdp_run / "node0.log").read_text()
    for rank in range(4):
        weights = {r["step"]: r["weights"] for r in read_records(hsdp_run / "records", rank)}  # this rank's shards
        assert sorted(weights) == list(range(NODES_STEPS))
        assert weights[POISONED_STEP] == weights[POISONED_STEP - 1]
        assert weights[POISONED_STEP + 1] != weights[POISONED_STEP] != weights[POISONED_STEP - 2]


def test_hsdp_moves_the_collectives_comm_volume_computes(hsdp_run):
    """Per step and rank: all-gathers and reduce-scatters inside the 2-rank shard group
    (one "node"), all-reduces of the gradient shards across the 2 replicas, float32 on
    CPU; bytes equal to benchmarks/comm_volume.py's arithmetic for this model."""
    from framework.config import ModelConfig

    model = ModelConfig(vocab_size=VOCAB, d_model=32, n_layers=LAYERS, n_heads=4, max_seq_len=SEQ_LEN, **LLAMA)
    expected = expected_calls(micro_batch_collectives(model, "hsdp", nodes=2, gpus_per_node=2))
    assert {op for op, *_ in expected} == {"all_gather", "reduce_scatter", "all_reduce"}
    guard = expected_calls(optimizer_step_collectives(nodes=2, gpus_per_node=2))  # the non-finite flags
    for rank in read_ranks(hsdp_run / "probe", 4):
        for step in rank["steps"]:
            assert recorded_calls(step["collectives"]) == expected + guard, (rank["rank"], step["step"])
        assert rank["parameter_dtypes"] == rank["optimizer_state_dtypes"] == ["float32"]


@pytest.mark.slow
def test_hsdp_resumes_exactly_from_its_sharded_checkpoint_and_eval_commands_load_it(hsdp_run, tiny_data, tmp_path):
    """Resume step 10's sharded folder (every rank reads its shards back) with the strategy
    now saving one gathered file; steps 11..20 repeat exactly, and that file and the
    first run's sharded folder load in the eval commands (framework.checkpoint.load_decoder)."""
    halfway = tmp_path / "run" / "checkpoints" / f"step-{HALF:08d}.ckpt"
    shutil.copytree(hsdp_run / "run" / "checkpoints" / halfway.name, halfway)
    assert halfway.is_dir() and (halfway / "meta.pt").is_file()  # FSDP2's folder of shards
    recipe = nodes_recipe(tmp_path, tiny_data, "hsdp", activation_checkpointing=True)
    launch_nodes(recipe, tmp_path, "--resume", str(halfway), "--trainer.strategy", "framework.strategies.HSDPStrategy",
                 "--trainer.strategy.save_distributed_checkpoint", "false", devices=2, strategy="hsdp")
    for straight, resumed in zip(read_ranks(hsdp_run / "probe", 4), read_ranks(tmp_path / "probe", 4)):
        tail = straight["steps"][HALF:]
        assert [s["step"] for s in resumed["steps"]] == [s["step"] for s in tail]
        assert [s["rows_per_call"] for s in resumed["steps"]] == [s["rows_per_call"] for s in tail]
        assert [s["loss"] for s in resumed["steps"]] == pytest.approx([s["loss"] for s in tail], rel=1e-6)
    reference = _parameters(hsdp_run, 0)
    last = tmp_path / "run" / "checkpoints" / "last.ckpt"
    assert last.is_file()
    _eval_commands_load(last, reference, tiny_data, tmp_path)
    (tmp_path / "sharded").mkdir()
    _eval_commands_load(hsdp_run / "run" / "checkpoints" / "last.ckpt", reference, tiny_data, tmp_path / "sharded")


def _eval_commands_load(ckpt: Path, reference: dict[str, torch.Tensor], data: Path, tmp_path: Path) -> None:
    from eval.measurements.exits import exits_main
    from framework.checkpoint import load_decoder
    from framework.checkpoint.export import main as export_main

    decoder, config = load_decoder(ckpt)
    assert (config.family, config.d_model, config.n_layers, config.vocab_size) == ("llama", 32, LAYERS, VOCAB)
    assert config.tie_embeddings and decoder.head.weight is decoder.embed.weight
    for name, tensor in decoder.named_parameters():
        torch.testing.assert_close(tensor, reference[name], rtol=1e-6, atol=1e-7, msg=name)
    report = tmp_path / "exits.json"
    assert exits_main(["--ckpt", str(ckpt), "--data", str(data), "--out", str(report), "--seq-len", str(SEQ_LEN),
                       "--batch-size", str(MICRO_BATCH), "--batches", "2"]) == 0
    exit_loss = json.loads(report.read_text())["exit_loss"]
    assert len(exit_loss) == LAYERS and all(math.isfinite(v) for v in exit_loss.values())
    assert export_main(["--ckpt", str(ckpt), "--out", str(tmp_path / "exported")]) == 0
    exported, _ = load_decoder(tmp_path / "exported")
    for name, tensor in exported.named_parameters():
        assert torch.equal(tensor, decoder.get_parameter(name)), name

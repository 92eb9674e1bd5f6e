"""Exact resume: 2N steps straight == N steps, a crash, and a resumed run (float32, CPU).

Weights, AdamW state, LR schedule, step counter and data-loader position come from the
checkpoint; the layer-dropout masks need no state (seed, rank, step, micro-batch,
layer), so every loss of the resumed steps is bit-for-bit the uninterrupted one.
"""

from __future__ import annotations

import json

import pytest

from framework.pretrain import main
from tiny_training import SimulatedCrash, tiny_cli_args

N = 4


def records(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def run_args(data_dir, root, record, *extra):
    callbacks = [{"class_path": "tiny_training.RecordLosses", "init_args": {"path": str(record)}}]
    return tiny_cli_args(data_dir, root, steps=2 * N, p_max=0.6) + [
        "--trainer.accumulate_grad_batches", "2", "--trainer.val_check_interval", "2",
        "--checkpoint.every_n_steps", str(N), "--trainer.logger", "false",
        "--trainer.callbacks", json.dumps(callbacks), *extra]


@pytest.mark.slow
def test_resumed_run_repeats_the_uninterrupted_losses_exactly(prepared_tokens, tmp_path):
    data_dir = prepared_tokens
    straight, resumed = tmp_path / "straight.jsonl", tmp_path / "resumed.jsonl"
    assert main(run_args(data_dir, tmp_path / "a", straight)) == 0

    crash = {"class_path": "tiny_training.CrashAtStep", "init_args": {"step": N + 2}}
    with pytest.raises(SimulatedCrash):
        main(run_args(data_dir, tmp_path / "b", resumed) + ["--trainer.callbacks+", json.dumps(crash)])
    before_crash = records(resumed)
    assert max(r["step"] for r in before_crash) == N + 1  # steps N, N+1 ran and were lost
    resumed.unlink()
    assert main(run_args(data_dir, tmp_path / "b", resumed, "--resume", "auto")) == 0

    expected = [r for r in records(straight) if r["step"] >= N]
    got = records(resumed)
    assert [(r["step"], r["micro"]) for r in got] == [(s, m) for s in range(N, 2 * N) for m in range(2)]
    assert [r["batch"] for r in got] == [r["batch"] for r in expected]  # the loader resumed in place
    assert [r["loss"] for r in got] == [r["loss"] for r in expected]  # bit for bit
    assert [r["loss"] for r in before_crash] == [r["loss"] for r in records(straight)[: len(before_crash)]]


def test_resume_auto_without_a_checkpoint_starts_fresh(prepared_tokens, tmp_path):
    data_dir = prepared_tokens
    record = tmp_path / "losses.jsonl"
    args = tiny_cli_args(data_dir, tmp_path / "run", steps=2) + [
        "--resume", "auto", "--trainer.logger", "false",
        "--trainer.callbacks", json.dumps([{"class_path": "tiny_training.RecordLosses",
                                            "init_args": {"path": str(record)}}])]
    assert main(args) == 0
    assert [r["step"] for r in records(record)] == [0, 1]

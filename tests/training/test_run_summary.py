"""The end-of-run summary: what it reports and writes, the text a person reads, throughput and MFU."""

from __future__ import annotations

import json
import math

import lightning.pytorch as pl
import pytest
import torch

from framework.config import EarlyExitLossConfig
from framework.training.callbacks import Throughput
from framework.training.run_summary import RunSummary, format_summary, in_loop_evaluation_summary
from tests.helpers.tiny_training import SEQ, RandomTokens, planned_flops, quiet_trainer, tiny_module


def test_summary_reports_the_run_and_writes_it(tmp_path, capsys):
    torch.manual_seed(0)
    twin = tmp_path / "dense.json"
    twin.write_text(json.dumps({"val_loss": 3.5, "training_flops": 1e9}))
    summary = RunSummary(compare_to=str(twin))
    trainer = quiet_trainer(max_steps=4, callbacks=[summary], limit_val_batches=None, val_check_interval=4,
                            default_root_dir=str(tmp_path))
    module = tiny_module(p_max=0.6)
    trainer.fit(module, RandomTokens())
    written = json.loads((tmp_path / "summary.json").read_text())
    assert written == summary.summary
    assert written["steps"] == 4 and written["tokens"] == 4 * 8 * 16
    assert written["ln_vocab"] == pytest.approx(math.log(64))
    assert written["val_loss"] == pytest.approx(trainer.callback_metrics["val/loss"].item())
    assert written["mean_dropout_predicted"] == pytest.approx(0.6 / 4, rel=1e-12)  # ILD + DTS: exactly P̄
    executed, dense = planned_flops(module, 4)
    assert written["flops_saved_pct"] == pytest.approx(100 * (1 - sum(f.blocks for f in executed)
                                                              / sum(f.blocks for f in dense)), rel=1e-12)
    assert written["training_flops"] == pytest.approx(sum(f.blocks for f in executed), rel=1e-12)
    # both conventions, named: the blocks (the paper's) and the whole step (blocks and head), executed and dense
    assert written["non_embedding_training_flops"] == written["training_flops"]
    assert written["dense_non_embedding_training_flops"] == pytest.approx(sum(f.blocks for f in dense), rel=1e-12)
    assert written["total_training_flops"] == pytest.approx(sum(f.total for f in executed), rel=1e-12)
    assert written["dense_total_training_flops"] == pytest.approx(sum(f.total for f in dense), rel=1e-12)
    assert 0 < written["total_flops_saved_pct"] < written["flops_saved_pct"]  # the head is never dropped
    out = capsys.readouterr().out
    assert "=== run summary ===" in out and "vs ln(V) = 4.159" in out and "dense twin       val loss 3.5000" in out
    assert "(the blocks only, the paper's count)" in out and "(blocks and head) vs" in out


def test_a_run_with_the_early_exit_loss_counts_its_heads(tmp_path, capsys):
    """Each exit head of the early-exit loss is one more unembedding on every token: the total FLOPs
    carry them (here 3 a step: exits 1-3 of 4, no curriculum), and a plain dense run is what they cost against."""
    torch.manual_seed(0)
    summary = RunSummary()
    trainer = quiet_trainer(max_steps=4, callbacks=[summary], default_root_dir=str(tmp_path))
    module = tiny_module(p_max=0.2, early_exit_loss=EarlyExitLossConfig(scale=0.5))
    trainer.fit(module, RandomTokens())
    written = json.loads((tmp_path / "summary.json").read_text())
    executed, dense = planned_flops(module, 4)
    assert written["early_exit_heads_per_step"] == 3
    head = sum(f.head for f in dense)  # one unembedding on every token
    assert written["total_training_flops"] == pytest.approx(sum(f.blocks for f in executed) + 4 * head, rel=1e-12)
    assert written["dense_total_training_flops"] == pytest.approx(sum(f.total for f in dense), rel=1e-12)
    # P̄ 5% saves less than three extra heads cost: "saved" alone would be wrong
    assert written["flops_saved_pct"] > 0 > written["total_flops_saved_pct"]
    assert written["total_flops_saved_pct"] == pytest.approx(
        100 * (1 - written["total_training_flops"] / written["dense_total_training_flops"]))
    out = capsys.readouterr().out
    assert f"{-written['total_flops_saved_pct']:.1f}% more" in out and "3.00 early-exit heads a step" in out


def test_summary_text_without_validation():
    text = format_summary({"steps": 1, "tokens": 2, "val_loss": None, "ln_vocab": 1.0, "flops_saved_pct": 0.0,
                           "mean_dropout_predicted": 0.0, "tensorboard": None, "checkpoint": None})
    assert "(no validation ran)" in text
    # with logging off it said `tensorboard --logdir None`
    assert "tensorboard --logdir" not in text and "TensorBoard      none (no logger" in text


def test_in_loop_evaluations_cost_goes_into_the_summary():
    class Evaluation(pl.Callback):
        evaluation_seconds = 12.5

    class Other(pl.Callback):
        evaluation_seconds = None  # not a number: not an evaluation's cost

    trainer = type("Trainer", (), {"callbacks": [Evaluation(), Other(), pl.Callback()]})()
    assert in_loop_evaluation_summary(trainer) == {"in_loop_evaluation_seconds": {"Evaluation": 12.5}}
    trainer.callbacks = [pl.Callback()]
    assert in_loop_evaluation_summary(trainer) == {}
    text = format_summary({"steps": 1, "tokens": 2, "val_loss": None, "ln_vocab": 1.0, "flops_saved_pct": 0.0,
                           "mean_dropout_predicted": 0.0, "tensorboard": None, "checkpoint": None,
                           "in_loop_evaluation_seconds": {"Evaluation": 12.5}})
    assert "in-loop eval     Evaluation: 12.5 s" in text


def test_the_summary_gives_the_runs_throughput_and_says_why_there_is_no_mfu_on_cpu(tmp_path, capsys):
    """On a CPU Lightning knows no peak FLOP/s: the summary said nothing about MFU at all."""
    trainer = quiet_trainer(max_steps=3, callbacks=[Throughput(), RunSummary()], default_root_dir=str(tmp_path))
    module = tiny_module(p_max=0.6)
    trainer.fit(module, RandomTokens())
    rates = json.loads((tmp_path / "summary.json").read_text())["throughput"]
    assert rates["mfu"] is None and "no peak FLOP/s known for this cpu device" in rates["mfu_missing"]
    assert rates["tokens_per_sec"] > 0 and rates["flops_per_sec"] > 0
    # FLOP/s and tokens/s share one clock: their ratio is the executed FLOPs per token
    executed, _ = planned_flops(module, 3)
    assert rates["flops_per_sec"] / rates["tokens_per_sec"] == pytest.approx(
        sum(f.total for f in executed) / (3 * 8 * SEQ), rel=1e-9)
    out = capsys.readouterr().out
    assert "MFU none: no peak FLOP/s known for this cpu device (set --throughput.peak_flops_per_device)" in out


def test_the_summary_gives_mfu_where_the_peak_is_known(tmp_path):
    trainer = quiet_trainer(max_steps=2, callbacks=[Throughput(peak_flops_per_device=1e12), RunSummary()],
                            default_root_dir=str(tmp_path))
    trainer.fit(tiny_module(), RandomTokens())
    rates = json.loads((tmp_path / "summary.json").read_text())["throughput"]
    assert rates["mfu"] == pytest.approx(rates["flops_per_sec"] / 1e12) and "mfu_missing" not in rates
    text = format_summary(json.loads((tmp_path / "summary.json").read_text()))
    assert f"MFU {rates['mfu']:.1%}" in text

"""Callbacks: schedule logging and FLOP account, throughput/MFU, summary."""

from __future__ import annotations

import json
import math

import lightning.pytorch as pl
import pytest
import torch

from framework.training.callbacks import (
    LayerDropoutSchedule,
    RunSummary,
    Throughput,
    format_summary,
    in_loop_evaluation_summary,
)
from framework.config import EarlyExitLossConfig, LayerDropoutConfig
from framework.flops import Flops, dense_step_flops, executed_step_flops
from framework.layer_dropout import StepKey, plan
from framework.schedules import dropout_rates, effective_depth_of, mean_dropout
from tests.helpers.tiny_training import SEQ, KeepingLogger, RandomTokens, quiet_trainer, tiny_module


class RecordStats(pl.Callback):
    def __init__(self) -> None:
        self.stats = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.stats.append(outputs["stats"])


def planned_flops(module, steps, *, accumulate=1, batch=8, rank=0):
    """Executed and dense FLOPs of every optimizer step, recomputed from the masks the
    step keys draw (not from anything the run reports)."""
    cfg, n = module.model_cfg, module.model_cfg.n_layers
    executed, dense = [], []
    for step in range(steps):
        rates = dropout_rates(module.dropout_cfg, n, step, steps)
        step_executed = step_dense = None
        for micro in range(accumulate):
            kept = ([(batch, batch)] * n if not any(rates) else
                    plan(module.dropout_cfg, rates, batch, StepKey(module.dropout_cfg.seed, rank, step, micro)).kept_counts())
            e, d = executed_step_flops(cfg, kept, SEQ, batch_size=batch), dense_step_flops(cfg, batch, SEQ)
            step_executed = e if step_executed is None else Flops(step_executed.attention + e.attention,
                                                                  step_executed.ffn + e.ffn, step_executed.head + e.head)
            step_dense = d if step_dense is None else Flops(step_dense.attention + d.attention,
                                                            step_dense.ffn + d.ffn, step_dense.head + d.head)
        executed.append(step_executed)
        dense.append(step_dense)
    return executed, dense


def fit(module, steps, *, callbacks=(), accumulate=1, **kwargs):
    logger = KeepingLogger()
    trainer = quiet_trainer(max_steps=steps, logger=logger, callbacks=list(callbacks),
                            accumulate_grad_batches=accumulate, **kwargs)
    trainer.fit(module, RandomTokens())
    return trainer, logger


def test_schedule_metrics_follow_the_rates_and_the_executed_flops():
    torch.manual_seed(0)
    record = RecordStats()
    module = tiny_module(p_max=0.6, schedule="decreasing")
    trainer, logger = fit(module, 6, callbacks=[record], accumulate=2)
    rates = [dropout_rates(module.dropout_cfg, 4, t, 6) for t in range(6)]
    assert logger.values("layer_dropout/mean_p") == pytest.approx([sum(r) / 4 for r in rates])
    assert logger.values("layer_dropout/effective_depth") == pytest.approx([effective_depth_of(r) for r in rates])
    planned, planned_dense = planned_flops(module, 6, accumulate=2)
    executed, dense = [f.blocks for f in planned], [f.blocks for f in planned_dense]
    assert executed == [a.executed.blocks + b.executed.blocks for a, b in zip(record.stats[::2], record.stats[1::2])]
    assert logger.values("flops/executed_step") == pytest.approx(executed)
    assert logger.values("flops/dense_step") == pytest.approx(dense)
    saved = [100 * (1 - sum(executed[: t + 1]) / sum(dense[: t + 1])) for t in range(6)]
    assert logger.values("flops/saved_pct") == pytest.approx(saved)
    assert saved[-1] > 0
    assert logger.values("layer_dropout/mean_dropout_predicted") == [pytest.approx(mean_dropout(
        module.dropout_cfg, 4, 6))]
    assert logger.values("layer_dropout/mean_dropout_achieved") == [pytest.approx(saved[-1] / 100)]


def test_count_masks_realise_the_predicted_mean_dropout_exactly_where_b_times_p_is_whole():
    """B·p = 8·0.5 rows: the count has nothing to round, so the saving is exact, not a draw."""
    torch.manual_seed(0)
    module = tiny_module(layer_dropout=LayerDropoutConfig(p_max=0.5, distribution="uniform", schedule="constant",
                                                          mask="count"))
    trainer, _ = fit(module, 3)
    schedule = next(cb for cb in trainer.callbacks if isinstance(cb, LayerDropoutSchedule))
    assert schedule.saved_fraction() == pytest.approx(0.5)
    assert schedule.report(trainer, module)["mean_dropout_predicted"] == pytest.approx(0.5)


def test_dense_run_saves_nothing():
    trainer, logger = fit(tiny_module(p_max=0.0), 2)
    assert logger.values("flops/saved_pct") == [0.0, 0.0]
    assert logger.values("layer_dropout/effective_depth") == [4.0, 4.0]


@pytest.mark.parametrize("accumulate", [1, 2])
def test_throughput_logs_the_flops_the_plans_executed(accumulate):
    """FLOPs/s over tokens/s is the window's FLOPs per token: it must be what the drawn
    plans executed (blocks on their kept rows, plus the head), counted once."""
    torch.manual_seed(0)
    module = tiny_module(p_max=0.6)
    _, logger = fit(module, 4, callbacks=[Throughput(peak_flops_per_device=1e9)], log_every_n_steps=2,
                    accumulate=accumulate)
    tokens, flops, mfu = (logger.values(f"throughput/{k}") for k in ("tokens_per_sec", "flops_per_sec", "mfu"))
    assert len(tokens) == len(mfu) == 2 and all(t > 0 for t in tokens)
    assert mfu == pytest.approx([f / 1e9 for f in flops])
    executed, dense = planned_flops(module, 4, accumulate=accumulate)
    window_tokens = 2 * accumulate * 8 * SEQ
    windows = [executed[0].total + executed[1].total, executed[2].total + executed[3].total]
    assert [f / t * window_tokens for f, t in zip(flops, tokens)] == pytest.approx(windows, rel=1e-9)
    assert windows[0] < dense[0].total + dense[1].total  # the first steps do drop
    # Executed FLOPs per token (blocks + head) are below the dense count under dropout.
    _, dense_logger = fit(tiny_module(p_max=0.0), 4, callbacks=[Throughput()], log_every_n_steps=2)
    assert "throughput/mfu" not in dense_logger.metrics  # no peak known for a CPU


def test_peak_flops_must_be_positive():
    with pytest.raises(ValueError, match="peak_flops_per_device=0 is invalid"):
        Throughput(peak_flops_per_device=0)


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


def test_step_metrics_follow_the_trainer_log_cadence_and_step_numbers():
    torch.manual_seed(0)
    _, logger = fit(tiny_module(), 4, log_every_n_steps=2)
    steps = {key: [s for s, _ in logger.metrics[key]] for key in ("train/loss", "layer_dropout/mean_p",
                                                                  "flops/saved_pct")}
    assert steps["layer_dropout/mean_p"] == steps["flops/saved_pct"] == steps["train/loss"] == [1, 3]

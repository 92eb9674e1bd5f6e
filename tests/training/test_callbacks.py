"""Callbacks: schedule logging and FLOP account, throughput/MFU."""

from __future__ import annotations

import lightning.pytorch as pl
import pytest
import torch

from framework.training.callbacks import LayerDropoutSchedule, Throughput
from framework.config import LayerDropoutConfig
from framework.schedules import dropout_rates, effective_depth_of, mean_dropout
from tests.helpers.tiny_training import SEQ, KeepingLogger, RandomTokens, planned_flops, quiet_trainer, tiny_module


class RecordStats(pl.Callback):
    def __init__(self) -> None:
        self.stats = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.stats.append(outputs["stats"])


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


def test_step_metrics_follow_the_trainer_log_cadence_and_step_numbers():
    torch.manual_seed(0)
    _, logger = fit(tiny_module(), 4, log_every_n_steps=2)
    steps = {key: [s for s, _ in logger.metrics[key]] for key in ("train/loss", "layer_dropout/mean_p",
                                                                  "flops/saved_pct")}
    assert steps["layer_dropout/mean_p"] == steps["flops/saved_pct"] == steps["train/loss"] == [1, 3]

"""Training health: per-group gradient norm, update/weight RMS ratio and max logit,
checked against a slow per-parameter reference taken in the same run."""

from __future__ import annotations

import math

import lightning.pytorch as pl
import pytest
import torch

from framework.config import LayerDropoutConfig
from framework.training.health import TrainingHealth
from tests.helpers.tiny_training import KeepingLogger, RandomTokens, quiet_trainer, tiny_module


class Reference(pl.Callback):
    """The same quantities, one parameter at a time in plain Python, on every step."""

    def __init__(self) -> None:
        self.max_logit, self.grad_norm, self.before, self.ratio, self.stats = {}, {}, {}, {}, []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        with torch.no_grad():  # dense run: the training forward's logits are these
            self.max_logit[trainer.global_step] = float(pl_module.model(batch[0]).max())

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        step = trainer.global_step
        for group in optimizer.param_groups:
            squares = sum(float(p.grad.double().pow(2).sum()) for p in group["params"])
            self.grad_norm[(step, group["name"])] = math.sqrt(squares)
            self.before[(step, group["name"])] = [p.detach().clone() for p in group["params"]]

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.stats.append(outputs["stats"])
        step = trainer.global_step - 1
        for group in trainer.optimizers[0].param_groups:
            before = self.before[(step, group["name"])]
            update = sum(float((p.detach().double() - b.double()).pow(2).sum())
                         for p, b in zip(group["params"], before))
            weight = sum(float(b.double().pow(2).sum()) for b in before)
            self.ratio[(step, group["name"])] = math.sqrt(update / weight)


def test_health_metrics_match_a_per_parameter_reference_on_logging_steps_only():
    module = tiny_module(layer_dropout=LayerDropoutConfig(p_max=0.0))
    reference, logger = Reference(), KeepingLogger()
    trainer = quiet_trainer(max_steps=6, logger=logger, callbacks=[reference], log_every_n_steps=2)
    trainer.fit(module, RandomTokens(batches=6))
    assert sum(isinstance(cb, TrainingHealth) for cb in trainer.callbacks) == 1  # installed by the module
    groups = [g["name"] for g in trainer.optimizers[0].param_groups]
    assert set(groups) == {"hidden", "norms_and_biases", "embedding", "final_norm", "unembedding"}
    logged_steps = [1, 3, 5]  # (step + 1) % log_every_n_steps == 0
    assert [s for s, _ in logger.metrics["health/max_logit"]] == logged_steps
    for step, value in logger.metrics["health/max_logit"]:
        assert value == pytest.approx(reference.max_logit[step], rel=1e-5)
    for name in groups:
        grads = dict(logger.metrics[f"health/grad_norm/{name}"])
        ratios = dict(logger.metrics[f"health/update_rms_ratio/{name}"])
        assert sorted(grads) == sorted(ratios) == logged_steps
        for step in logged_steps:
            assert grads[step] == pytest.approx(reference.grad_norm[(step, name)], rel=1e-5)
            assert ratios[step] == pytest.approx(reference.ratio[(step, name)], rel=1e-5)
            assert 0 < ratios[step] < 1
    # The max logit is only taken (a device reduction) on the steps that log it.
    assert [s.step for s in reference.stats if s.max_logit is not None] == logged_steps


def test_the_max_logit_is_the_largest_over_accumulated_micro_batches():
    module = tiny_module(layer_dropout=LayerDropoutConfig(p_max=0.0))
    logger, maxima = KeepingLogger(), []

    class PerMicroBatch(pl.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            with torch.no_grad():
                maxima.append((trainer.global_step, float(pl_module.model(batch[0]).max())))

    trainer = quiet_trainer(max_steps=2, logger=logger, callbacks=[PerMicroBatch()], log_every_n_steps=1,
                            accumulate_grad_batches=2)
    trainer.fit(module, RandomTokens(batches=4))
    logged = dict(logger.metrics["health/max_logit"])
    assert sorted(logged) == [0, 1]
    for step in (0, 1):
        assert logged[step] == pytest.approx(max(v for s, v in maxima if s == step), rel=1e-5)

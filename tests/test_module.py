"""LayerDropModule: the scheduled drop plan, the loss, the optimizer, the checkpoint hooks."""

from __future__ import annotations

import math

import lightning.pytorch as pl
import pytest
import torch
import torch.nn.functional as F
from lightning.fabric.utilities.init import _materialize_distributed_module

from framework.config import ModelConfig, ParametrizationConfig
from framework.layer_dropout import StepKey, plan
from framework.lr_schedule import LRScheduleConfig, lr_factor
from framework.module import LayerDropModule, check_same_model
from framework.parametrization import init_stds
from framework.schedules import dropout_rates
from tiny_training import RandomTokens, quiet_trainer, tiny_module


class RecordPlans(pl.Callback):
    """Records (step, micro-batch index, rates, kept rows per layer) of every micro-batch."""

    def __init__(self) -> None:
        self.seen = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        stats = pl_module.last_micro_batch
        # Attention rows run, summed over layers: executed FLOPs over the FLOPs of one row.
        per_row = stats.dense.attention / (pl_module.model_cfg.n_layers * batch[0].shape[0])
        self.seen.append((pl_module.schedule_position[0], batch_idx % trainer.accumulate_grad_batches,
                          stats.rates, round(stats.executed.attention / per_row)))


def test_training_step_draws_the_scheduled_plan_from_the_step_key():
    torch.manual_seed(0)
    module, record = tiny_module(p_max=0.6), RecordPlans()
    trainer = quiet_trainer(max_steps=4, accumulate_grad_batches=2, callbacks=[record])
    trainer.fit(module, RandomTokens())
    assert [(s, m) for s, m, _, _ in record.seen] == [(s, m) for s in range(4) for m in range(2)]
    for step, micro, rates, kept_rows in record.seen:
        assert rates == pytest.approx(dropout_rates(module.dropout_cfg, 4, step, 4))
        expected = plan(module.dropout_cfg, rates, 8, StepKey(7, 0, step, micro)) if any(rates) else None
        expected_rows = 8 * 4 if expected is None else sum(a for a, _ in expected.kept_counts())
        assert kept_rows == expected_rows


def test_nothing_to_drop_takes_the_dense_path():
    module = tiny_module(p_max=0.0)
    assert module.drop_plan([0.0] * 4, batch_size=8, step=0, micro_batch=0) is None
    module = tiny_module(p_max=0.4)
    assert module.drop_plan([0.0, 0.0, 0.0, 0.0], batch_size=8, step=3, micro_batch=0) is None
    drawn = module.drop_plan([0.0, 0.2, 0.4, 0.6], batch_size=8, step=3, micro_batch=1)
    assert drawn.kept_counts() == plan(module.dropout_cfg, [0.0, 0.2, 0.4, 0.6], 8,
                                       StepKey(7, 0, 3, 1)).kept_counts()


def test_loss_equals_cross_entropy_of_the_model_logits():
    torch.manual_seed(0)
    module = tiny_module(loss_chunk_tokens=5)
    module.configure_model()
    inputs, targets = torch.randint(0, 64, (2, 2, 16))
    expected = F.cross_entropy(module.model(inputs).flatten(0, 1), targets.flatten())
    assert module.loss(inputs, targets).item() == pytest.approx(expected.item(), abs=1e-6)


def test_parametrization_sets_multipliers_init_and_optimizer_groups():
    torch.manual_seed(0)
    pcfg = ParametrizationConfig(d_base=16, n_layers_base=2, lr=1e-2, tau_ema=0.25)
    module = tiny_module(parametrization=pcfg, lr_schedule=LRScheduleConfig(warmup_steps=2, decay="cosine"))
    assert module.model_cfg.logit_multiplier == pytest.approx(16 / 32)  # 1/m_d
    assert module.model_cfg.residual_multiplier == pytest.approx(2 / 4)  # 1/m_L
    module.configure_model()
    hidden_std = init_stds(pcfg, module.model_cfg)["hidden"]
    assert module.model.blocks[0].ffn.up.weight.std().item() == pytest.approx(hidden_std, rel=0.05)

    trainer = quiet_trainer(max_steps=10)
    module.trainer = trainer
    config = module.configure_optimizers()
    groups = {g["name"]: g for g in config["optimizer"].param_groups}
    hidden_lr = 1e-2 / 2  # η/m_d
    # LambdaLR has already applied the factor of step 0 (warmup 1/2).
    assert groups["hidden"]["lr"] == pytest.approx(hidden_lr * lr_factor(0, total_steps=10, warmup_steps=2))
    assert groups["embedding"]["lr"] == pytest.approx(1e-2 * 0.5)
    assert groups["hidden"]["weight_decay"] == pytest.approx(1 / (hidden_lr * 0.25 * 10))  # B/(η·τ·D)
    assert groups["embedding"]["weight_decay"] == 0.0
    assert config["lr_scheduler"]["interval"] == "step"


def test_validation_is_the_token_mean_without_dropout():
    torch.manual_seed(0)
    module, data = tiny_module(p_max=0.6), RandomTokens()
    trainer = quiet_trainer(limit_val_batches=None)
    [result] = trainer.validate(module, datamodule=data, verbose=False)
    module.model.eval()
    with torch.no_grad():
        inputs, targets = data.val.tensors
        expected = F.cross_entropy(module.model(inputs).flatten(0, 1), targets.flatten())
    assert result["val/loss"] == pytest.approx(expected.item(), abs=1e-5)
    assert result["val/ppl"] == pytest.approx(math.exp(expected.item()), rel=1e-5)


def test_model_built_on_meta_gets_the_parametrized_init_after_materialisation():
    torch.manual_seed(0)
    module = tiny_module()
    with torch.device("meta"):
        module.configure_model()
    assert module.model.embed.weight.is_meta
    _materialize_distributed_module(module, torch.device("cpu"))  # what a sharding strategy does
    module.on_fit_start()
    stds = init_stds(module.param_cfg, module.model_cfg)
    assert module.model.blocks[1].attn.qkv.weight.std().item() == pytest.approx(stds["hidden"], rel=0.05)
    assert torch.all(module.model.blocks[1].attn_norm.weight == 1)
    assert torch.isfinite(module.model.blocks[0].attn.slopes).all()
    tokens = torch.randint(0, 64, (2, 16))
    assert torch.isfinite(module.model(tokens)).all()


def test_hand_set_multiplier_that_disagrees_is_an_error():
    with pytest.raises(ValueError, match="logit_multiplier=0.3 is invalid: it is derived"):
        LayerDropModule(decoder=ModelConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=2,
                                            logit_multiplier=0.3),
                        parametrization=ParametrizationConfig(d_base=16, n_layers_base=2))


def test_explicit_distribution_must_match_the_depth():
    from framework.config import LayerDropoutConfig

    with pytest.raises(ValueError, match="one rate per layer"):
        LayerDropModule(decoder=ModelConfig(vocab_size=64, d_model=32, n_layers=3, n_heads=2),
                        layer_dropout=LayerDropoutConfig(distribution=[0.0, 0.5]))


def test_without_max_steps_the_run_is_refused_before_training():
    module = tiny_module(schedule="decreasing")
    with pytest.raises(ValueError, match="schedule='decreasing' needs the run length"):
        quiet_trainer(max_epochs=1).fit(module, RandomTokens(batches=2))
    module = tiny_module(schedule="constant")
    with pytest.raises(ValueError, match="trainer.max_steps=-1 is invalid"):
        quiet_trainer(max_epochs=1).fit(module, RandomTokens(batches=2))


def test_resume_into_another_shape_is_refused_with_the_differences():
    saved = tiny_module(layers=4).model_cfg.to_dict()
    with pytest.raises(ValueError, match=r"n_layers: checkpoint 4, config 2"):
        check_same_model(saved, tiny_module(layers=2).model_cfg.to_dict())
    same = dict(saved, attention="sdpa", max_seq_len=1024)  # runtime choices may change
    check_same_model(saved, same)
    with pytest.raises(ValueError, match="not written by layerdrop pretrain"):
        tiny_module().on_load_checkpoint({"state_dict": {}})


def test_bad_loss_chunk_is_rejected():
    with pytest.raises(ValueError, match="loss_chunk_tokens=0 is invalid"):
        tiny_module(loss_chunk_tokens=0)

"""LayerDropModule: the scheduled drop plan, the loss, the optimizer, the checkpoint hooks."""

from __future__ import annotations

import math

import lightning.pytorch as pl
import pytest
import torch
from lightning.fabric.utilities.init import _materialize_distributed_module
from lightning.pytorch.strategies import SingleDeviceStrategy

from framework.config import LayerDropoutConfig, ModelConfig, ParametrizationConfig
from framework.flops import dense_step_flops, executed_step_flops
from framework.layer_dropout import StepKey, plan
from framework.training.lr_schedule import LRScheduleConfig, lr_factor
from framework.training.module import LayerDropModule, check_same_model
from framework.training.parametrization import init_stds
from framework.schedules import dropout_rates
from tests.helpers.reference_decoder import reference_loss
from tests.helpers.tiny_training import RandomTokens, quiet_trainer, tiny_module


class RecordStats(pl.Callback):
    """Keeps the MicroBatchStats that every training micro-batch returned."""

    def __init__(self) -> None:
        self.seen = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.seen.append(outputs["stats"])


def rows_of(drop_plan):
    return None if drop_plan is None else [(layer.attn_rows.tolist() if layer.attn_rows is not None else None)
                                           for layer in drop_plan.layers]


def test_training_step_draws_the_scheduled_plan_from_the_step_key():
    torch.manual_seed(0)
    module, record = tiny_module(p_max=0.6), RecordStats()
    trainer = quiet_trainer(max_steps=4, accumulate_grad_batches=2, callbacks=[record])
    trainer.fit(module, RandomTokens())
    assert [(s.step, s.micro_batch, s.total_steps) for s in record.seen] == \
        [(t, m, 4) for t in range(4) for m in range(2)]
    for stats in record.seen:
        assert stats.rates == pytest.approx(dropout_rates(module.dropout_cfg, 4, stats.step, 4))
        expected = plan(module.dropout_cfg, stats.rates, 8, StepKey(7, 0, stats.step, stats.micro_batch)) \
            if any(stats.rates) else None
        assert rows_of(stats.plan) == rows_of(expected)
        kept = expected.kept_counts() if expected else [(8, 8)] * 4
        assert stats.executed == executed_step_flops(module.model_cfg, kept, 16, batch_size=8)
        assert stats.dense == dense_step_flops(module.model_cfg, 8, 16)


def test_each_rank_draws_the_masks_of_its_own_step_key():
    """Rank r draws StepKey(seed, r, step, micro-batch): a rank that drew rank 0's masks
    (the same on every device) would be caught here, without launching processes."""
    torch.manual_seed(0)
    module, record = tiny_module(p_max=0.6, schedule="constant"), RecordStats()
    strategy = SingleDeviceStrategy("cpu")
    strategy.global_rank = 3  # one process that is what rank 3 of a real run would be
    trainer = quiet_trainer(max_steps=3, callbacks=[record], strategy=strategy)
    assert module.global_rank == 0 and trainer.global_rank == 3
    trainer.fit(module, RandomTokens())
    assert [s.step for s in record.seen] == [0, 1, 2]
    for stats in record.seen:
        own = plan(module.dropout_cfg, stats.rates, 8, StepKey(7, 3, stats.step, 0))
        rank_zero = plan(module.dropout_cfg, stats.rates, 8, StepKey(7, 0, stats.step, 0))
        assert rows_of(stats.plan) == rows_of(own)
        assert rows_of(stats.plan) != rows_of(rank_zero)


def test_nothing_to_drop_takes_the_dense_path():
    module = tiny_module(p_max=0.0)
    assert module.drop_plan([0.0] * 4, batch_size=8, step=0, micro_batch=0) is None
    module = tiny_module(p_max=0.4)
    assert module.drop_plan([0.0, 0.0, 0.0, 0.0], batch_size=8, step=3, micro_batch=0) is None
    drawn = module.drop_plan([0.0, 0.2, 0.4, 0.6], batch_size=8, step=3, micro_batch=1)
    assert drawn.kept_counts() == plan(module.dropout_cfg, [0.0, 0.2, 0.4, 0.6], 8,
                                       StepKey(7, 0, 3, 1)).kept_counts()


def test_loss_equals_the_reference_forward_with_and_without_a_plan():
    torch.manual_seed(0)
    module = tiny_module(loss_chunk_tokens=5)  # m_d = m_L = 2: both multipliers are 1/2
    module.configure_model()
    assert (module.model_cfg.logit_multiplier, module.model_cfg.residual_multiplier) == (0.5, 0.5)
    inputs, targets = torch.randint(0, 64, (2, 4, 16))
    expected = reference_loss(module.model, inputs, targets)
    assert module.loss(inputs, targets).item() == pytest.approx(expected.item(), abs=1e-5)
    rates = [0.0, 0.5, 0.5, 0.5]
    drop = module.drop_plan(rates, 4, step=0, micro_batch=0)
    keep = [torch.zeros(4, dtype=torch.bool).index_fill(0, layer.attn_rows, True) if layer.attn_rows is not None
            else torch.ones(4, dtype=torch.bool) for layer in drop.layers]
    expected = reference_loss(module.model, inputs, targets, attn_masks=keep,
                              scales=[1 / (1 - p) for p in rates])
    assert module.loss(inputs, targets, drop).item() == pytest.approx(expected.item(), abs=1e-5)


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
    with torch.no_grad():
        inputs, targets = data.val.tensors
        expected = reference_loss(module.model, inputs, targets)
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
    with pytest.raises(ValueError, match=r"^layer_dropout.distribution=\[0.0, 0.5\] is invalid: .*one rate per layer \(3\)"):
        LayerDropModule(decoder=ModelConfig(vocab_size=64, d_model=32, n_layers=3, n_heads=2),
                        layer_dropout=LayerDropoutConfig(distribution=[0.0, 0.5]))


@pytest.mark.parametrize("schedule", ["decreasing", "constant"])
def test_without_max_steps_the_run_is_refused_before_training(schedule):
    module = tiny_module(schedule=schedule)
    with pytest.raises(ValueError, match="trainer.max_steps=-1 is invalid"):
        quiet_trainer(max_epochs=1).fit(module, RandomTokens(batches=2))
    assert module.model.blocks[0].ffn.up.weight.grad is None  # no step ran


def test_resume_into_another_shape_is_refused_with_the_differences():
    saved = tiny_module(layers=4).model_cfg.to_dict()
    with pytest.raises(ValueError, match=r"n_layers: checkpoint 4, config 2"):
        check_same_model(saved, tiny_module(layers=2).model_cfg.to_dict())
    same = dict(saved, attention="sdpa", max_seq_len=1024)  # runtime choices may change
    check_same_model(saved, same)
    with pytest.raises(ValueError, match="not written by layerdrop pretrain"):
        tiny_module().on_load_checkpoint({"state_dict": {}})


def test_bad_loss_chunk_is_rejected():
    with pytest.raises(ValueError, match="^loss_chunk_tokens=0 is invalid: must be > 0$"):
        tiny_module(loss_chunk_tokens=0)

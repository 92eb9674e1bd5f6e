"""The configs: the paper's sizes, one validation when built (one line naming the field), frozen after."""

from __future__ import annotations

import dataclasses
import math
import re
import typing
from dataclasses import fields

from pathlib import Path

import pytest
import torch

from framework.config import (
    LLAMA3_VOCAB_SIZE,
    EarlyExitLossConfig,
    LayerDropoutConfig,
    ModelConfig,
    ParametrizationConfig,
    PositiveInt,
    check,
)
from framework.early_exit_loss import CURRICULA, SCALE_FUNCTIONS
from framework.layer_dropout import MASK_MODES
from framework.training.lr_schedule import LRScheduleConfig
from framework.model.decoder import Decoder
from framework.schedules import DISTRIBUTIONS, TIME_SCHEDULES

# Table A.1 of the paper: name -> (parameters, d, L, heads, head size).
TABLE_A1 = {
    "271M": (271e6, 640, 13, 10, 64),
    "504M": (504e6, 896, 17, 14, 64),
    "906M": (906e6, 1152, 23, 9, 128),
    "1.8B": (1.8e9, 1536, 30, 12, 128),
    "3.9B": (3.9e9, 2048, 40, 16, 128),
    "8.2B": (8.2e9, 2688, 52, 21, 128),
}


@pytest.mark.parametrize("name", list(TABLE_A1))
def test_paper_sizes_match_table_a1(name):
    params, d, layers, heads, head_dim = TABLE_A1[name]
    cfg = ModelConfig.paper(name)
    assert (cfg.d_model, cfg.n_layers, cfg.n_heads, cfg.head_dim) == (d, layers, heads, head_dim)
    assert cfg.vocab_size == LLAMA3_VOCAB_SIZE == 128_256
    assert cfg.ffn_dim == 8 * d
    with torch.device("meta"):  # never allocate 8B parameters on a CI machine
        decoder = Decoder(cfg)
    count = sum(p.numel() for p in decoder.parameters())
    assert count == decoder.num_parameters()
    assert abs(count - params) / params < 0.015, f"{name}: {count / 1e6:.1f}M parameters"


def test_paper_overrides_and_unknown_name():
    assert ModelConfig.paper("271M", max_seq_len=512).max_seq_len == 512
    with pytest.raises(ValueError, match="name='1B'.*271M"):
        ModelConfig.paper("1B")


def test_head_dim_defaults_to_d_over_heads():
    cfg = ModelConfig(d_model=96, n_heads=6)
    assert cfg.head_dim == 16 and cfg.attn_dim == 96
    assert ModelConfig(d_model=64, n_heads=3, head_dim=32).attn_dim == 96


@pytest.mark.parametrize("field, value", [
    ("vocab_size", 0), ("d_model", -8), ("n_layers", 0), ("n_layers", 2.0), ("n_layers", True),
    ("n_heads", 0), ("head_dim", 0), ("ffn_mult", 0), ("max_seq_len", -1),
    ("attention", "cuda"), ("norm_eps", 0.0), ("init_std", float("nan")),
    ("logit_multiplier", -1.0), ("residual_multiplier", 0),
])
def test_model_config_rejects_bad_values(field, value):
    with pytest.raises(ValueError, match=f"^{field}="):
        ModelConfig(**{field: value})


def test_model_config_heads_must_divide_width_without_head_dim():
    with pytest.raises(ValueError, match="n_heads=5 .*d_model=64"):
        ModelConfig(d_model=64, n_heads=5)


def test_model_config_dict_round_trip_and_unknown_keys():
    cfg = ModelConfig(vocab_size=300, d_model=48, n_layers=3, n_heads=3, residual_multiplier=0.5)
    assert ModelConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ValueError, match="model config keys=\\['dim'\\]"):
        ModelConfig.from_dict({**cfg.to_dict(), "dim": 3})


# config.json / a checkpoint's hparams as the code before the families owned their fields
# wrote them (every field flat, the Llama family's at their defaults on a Celerity model).
SAVED_BEFORE = {"vocab_size": 2048, "d_model": 64, "n_layers": 12, "n_heads": 2, "head_dim": 32, "ffn_mult": 8,
                "max_seq_len": 128, "attention": "sdpa", "norm_eps": 1e-05, "bias": True, "init_std": 0.05,
                "logit_multiplier": 1.0, "residual_multiplier": 1.0, "family": "celerity", "n_kv_heads": 2,
                "ffn_hidden": None, "tie_embeddings": False, "rope_theta": 10000.0, "rope_type": "default",
                "rope_factor": 8.0, "rope_low_freq_factor": 1.0, "rope_high_freq_factor": 4.0,
                "rope_original_max_seq_len": 8192}


@pytest.mark.parametrize("saved", [SAVED_BEFORE, {**SAVED_BEFORE, "family": "llama", "bias": False, "n_kv_heads": 1,
                                                  "tie_embeddings": True, "rope_theta": 5e5, "rope_type": "llama3"}],
                         ids=["celerity", "llama"])
def test_the_saved_form_of_a_model_config_loads_and_is_written_again(saved):
    cfg = ModelConfig.from_dict(saved)
    assert cfg.to_dict() == saved and list(cfg.to_dict()) == list(saved)  # the same keys, in the same order
    assert ModelConfig(**saved) == cfg


def test_a_family_field_is_the_familys_and_refused_elsewhere():
    from framework.families import FIELD_OWNERS, FamilyFields
    from framework.families.llama.args import LlamaArgs

    assert set(FIELD_OWNERS) == {f.name for f in fields(FamilyFields)} >= {f.name for f in fields(LlamaArgs)}
    owners = FIELD_OWNERS["rope_theta"]
    assert {"llama", "qwen2", "qwen3"} <= set(owners) and "celerity" not in owners
    with pytest.raises(ValueError, match=r"^rope_theta=500000.0 is invalid for family='celerity': it is a field of "):
        ModelConfig(rope_theta=5e5)
    with pytest.raises(ValueError, match=r"^rope_factor=0.0 is invalid: must be > 0"):
        ModelConfig(family="llama", bias=False, rope_factor=0.0)
    with pytest.raises(ValueError, match=r"^rope_type='yarn' is invalid: allowed: default, llama3"):
        ModelConfig(family="llama", bias=False, rope_type="yarn")


@pytest.mark.parametrize("config", [ModelConfig(), LayerDropoutConfig(), ParametrizationConfig(), LRScheduleConfig(),
                                    EarlyExitLossConfig()])
def test_configs_are_frozen_once_validated(config):
    name = fields(config)[0].name
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(config, name, getattr(config, name))


def test_layer_dropout_defaults_are_the_recommended_recipe():
    cfg = LayerDropoutConfig()
    assert (cfg.p_max, cfg.distribution, cfg.schedule, cfg.r_train, cfg.structure, cfg.mask) == (
        0.0, "increasing", "decreasing", "inverse_density", "layer", "sequence")


@pytest.mark.parametrize("field, value, message", [
    ("p_max", 1.0, r"must be in \[0, 1\)"), ("p_max", -0.1, r"\[0, 1\)"), ("p_max", True, "expected a finite number"),
    ("p_max", "0.2", "expected a finite number"), ("p_max", math.nan, "finite"),
    ("distribution", "linear", f"allowed: {', '.join(DISTRIBUTIONS)} or a list"),
    ("distribution", [0.1, 1.0], r"every item must be in \[0, 1\)"), ("distribution", [-0.1], "every item"),
    ("schedule", "zigzag", f"allowed: {', '.join(TIME_SCHEDULES)}$"), ("structure", "head", "layer, sublayer"),
    ("mask", "token", f"allowed: {', '.join(MASK_MODES)}$"), ("r_train", "half", "inverse_density, one"),
    ("seed", -1, "must be >= 0"), ("seed", 1.5, "expected an integer"),
])
def test_layer_dropout_config_rejects_bad_values(field, value, message):
    with pytest.raises(ValueError, match=f"^{field}=.* is invalid: .*{message}"):
        LayerDropoutConfig(**{field: value})


def test_explicit_distribution_is_a_tuple_and_refuses_p_max():
    cfg = LayerDropoutConfig(distribution=[0, 0.1, 0.2])
    assert cfg.distribution == (0, 0.1, 0.2)
    with pytest.raises(ValueError, match=r"^p_max=0.3 is invalid with an explicit distribution: .*leave p_max out$"):
        LayerDropoutConfig(p_max=0.3, distribution=[0.0, 0.1])


def test_config_names_come_from_the_registries():
    """A distribution, schedule or mask mode added to its registry is a valid name at once."""
    hints = typing.get_type_hints(LayerDropoutConfig)
    distribution_names = typing.get_args(typing.get_args(hints["distribution"])[0])
    assert distribution_names == tuple(DISTRIBUTIONS)
    assert typing.get_args(hints["schedule"]) == tuple(TIME_SCHEDULES)
    assert typing.get_args(hints["mask"]) == tuple(MASK_MODES)


@pytest.mark.parametrize("kwargs, message", [
    (dict(scale=-0.5), r"^scale=-0.5 is invalid: must be >= 0$"),
    (dict(scale=1.0, exits="some"), r"^exits='some' is invalid: allowed: all or a list"),
    (dict(scale=1.0, exits=[0, 2]), r"^exits=\(0, 2\) is invalid: every item must be > 0$"),
    (dict(scale=1.0, exits=[2, 2]), r"^early_exit_loss.exits=\[2, 2\] is invalid: need distinct exits"),
    (dict(scale=1.0, every=0), r"^every=0 is invalid: must be > 0$"),
    (dict(scale=1.0, weighting="log"), f"^weighting='log' is invalid: allowed: {', '.join(SCALE_FUNCTIONS)}$"),
    (dict(scale=1.0, curriculum="random"), f"^curriculum='random' is invalid: allowed: {', '.join(CURRICULA)}$"),
    (dict(scale=1.0, curriculum="rotational", rotation=1), r"^rotation=1 is invalid: must be >= 2$"),
    (dict(scale=1.0, curriculum="gradual", ramp=0.0), r"^ramp=0.0 is invalid: must be in \(0, 1\]$"),
    # options that would change nothing are refused, not ignored
    (dict(weighting="sum"), r"^early_exit_loss.weighting='sum' is invalid: it changes nothing when the early-exit"
                            r" loss is off \(scale=0\)$"),
    (dict(scale=1.0, exits=[1, 3], every=2), r"^early_exit_loss.every=2 .*changes nothing when exits is a list$"),
    (dict(scale=1.0, rotation=3), r"^early_exit_loss.rotation=3 .*changes nothing when curriculum='none'$"),
    (dict(scale=1.0, curriculum="rotational", ramp=0.5), r"^early_exit_loss.ramp=0.5 .*curriculum='rotational'$"),
])
def test_early_exit_loss_config_rejects_bad_values_in_one_line(kwargs, message):
    with pytest.raises(ValueError, match=message):
        EarlyExitLossConfig(**kwargs)


def test_early_exit_loss_is_off_by_default_and_takes_a_list_of_exits():
    assert EarlyExitLossConfig().scale == 0.0
    assert EarlyExitLossConfig(scale=0.5, exits=[4, 2]).exits == (4, 2)


@pytest.mark.parametrize("field, value", [
    ("kind", "mup"), ("d_base", 0), ("n_layers_base", -2), ("lr", 0.0), ("eps", -1e-8),
    ("tau_ema", float("inf")), ("betas", (0.9, 1.0)), ("betas", (0.9,)),
])
def test_parametrization_config_rejects_bad_values(field, value):
    with pytest.raises(ValueError, match=f"^{field}="):
        ParametrizationConfig(**{field: value})


@pytest.mark.parametrize("field, value, bound", [
    ("lr", 1e39, r"must be in \(0, 1e4\]: AdamW moves each weight by about lr per step"), ("lr", 2e4, r"must be in \(0, 1e4\]"),
    ("eps", 1e39, r"must be in \(0, 1\]: ε is added to each gradient's RMS"),
])
def test_what_enters_adamw_is_bounded_and_the_message_says_the_bound(field, value, bound):
    """Finite is not enough: 1e39 passes as a float64 and overflows float32 in AdamW."""
    with pytest.raises(ValueError, match="^" + re.escape(f"{field}={value!r} is invalid: ") + bound):
        ParametrizationConfig(**{field: value})
    ParametrizationConfig(**{field: 1.0})  # the bound itself is allowed


def test_pretrain_refuses_a_huge_learning_rate_in_one_line(tmp_path):
    from tests.helpers.refusals import refused

    recipe = Path(__file__).resolve().parents[1] / "recipes" / "tiny.yaml"
    line = refused("pretrain", "--config", str(recipe), "--model.parametrization.lr", "1e39",
                   "--trainer.default_root_dir", str(tmp_path / "run"))
    assert "lr=1e+39 is invalid: must be in (0, 1e4]" in line
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("removed", ["batch_size_base", "tpp_base", "init_std"])
def test_parametrization_has_no_option_that_training_ignores(removed):
    """B_base and TPP_base are the base run's, read by `layerdrop recipe` from the base
    recipe; σ is decoder.init_std."""
    with pytest.raises(TypeError, match=removed):
        ParametrizationConfig(**{removed: 1})


def test_check_validates_a_plain_argument_and_refuses_unknown_types():
    check("loss_chunk_tokens", 4, PositiveInt)
    with pytest.raises(ValueError, match="^loss_chunk_tokens=0 is invalid: must be > 0$"):
        check("loss_chunk_tokens", 0, PositiveInt)
    with pytest.raises(TypeError, match="does not know the type"):
        check("x", 1, dict)

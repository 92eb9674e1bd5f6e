"""ModelConfig / LayerDropoutConfig / ParametrizationConfig: the paper's sizes and validation."""

from __future__ import annotations

import pytest
import torch

from framework.config import (
    LLAMA3_VOCAB_SIZE,
    LayerDropoutConfig,
    ModelConfig,
    ParametrizationConfig,
)
from framework.model import Decoder

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


def test_layer_dropout_defaults_are_the_recommended_recipe():
    cfg = LayerDropoutConfig()
    assert (cfg.distribution, cfg.schedule, cfg.r_train, cfg.structure, cfg.mask) == (
        "increasing", "decreasing", "inverse_density", "layer", "sequence")
    assert not cfg.enabled  # p_max = 0 is dense training
    assert LayerDropoutConfig(p_max=0.2).enabled
    assert LayerDropoutConfig(distribution=[0.0, 0.1]).enabled
    assert not LayerDropoutConfig(p_max=0.5, distribution=[0.0, 0.0]).enabled


@pytest.mark.parametrize("field, value", [
    ("p_max", 1.0), ("p_max", -0.1), ("p_max", True), ("p_max", "0.2"),
    ("distribution", "linear"), ("distribution", [0.1, 1.0]), ("distribution", [-0.1]),
    ("schedule", "cosine"), ("structure", "head"), ("mask", "token"),
    ("r_train", "half"), ("seed", -1), ("seed", 1.5),
])
def test_layer_dropout_config_rejects_bad_values(field, value):
    with pytest.raises(ValueError, match=f"^{field}="):
        LayerDropoutConfig(**{field: value})


def test_explicit_distribution_needs_one_rate_per_layer():
    cfg = LayerDropoutConfig(distribution=[0, 0.1, 0.2])
    assert cfg.distribution == [0.0, 0.1, 0.2]
    cfg.check_layers(3)
    with pytest.raises(ValueError, match="^distribution=.*one rate per layer \\(4\\)"):
        cfg.check_layers(4)


@pytest.mark.parametrize("field, value", [
    ("kind", "mup"), ("d_base", 0), ("n_layers_base", -2), ("batch_size_base", 0),
    ("lr", 0.0), ("eps", -1e-8), ("tau_ema", float("inf")), ("betas", (0.9, 1.0)),
])
def test_parametrization_config_rejects_bad_values(field, value):
    with pytest.raises(ValueError, match=f"^{field}="):
        ParametrizationConfig(**{field: value})

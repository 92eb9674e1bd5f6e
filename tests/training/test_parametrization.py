import dataclasses
import math

import pytest
import torch

from framework.config import ModelConfig, ParametrizationConfig
from framework.model.decoder import Decoder
from framework.training.parametrization import (
    adamw,
    groups_of,
    init_decoder_,
    model_multipliers,
    param_groups,
    transfer_batch_size,
    transfer_tau_ema,
    weight_decay,
)

STEPS = 1000
BATCH_TOKENS = 1024
TOTAL_TOKENS = STEPS * BATCH_TOKENS


def pcfg(kind="complete_p", **overrides):
    base = dict(kind=kind, d_base=32, n_layers_base=2, lr=4e-3, eps=1e-8, tau_ema=0.25)
    return ParametrizationConfig(**{**base, **overrides})


def model_config(d_model, n_layers, parametrization, vocab_size=64, init_std=0.02):
    cfg = ModelConfig(vocab_size=vocab_size, d_model=d_model, n_layers=n_layers,
                      n_heads=d_model // 16, max_seq_len=16, init_std=init_std)
    return dataclasses.replace(cfg, **model_multipliers(parametrization, cfg))


def decoder(d_model, n_layers, parametrization, **kwargs):
    torch.manual_seed(0)
    return Decoder(model_config(d_model, n_layers, parametrization, **kwargs))


def groups_by_name(model, parametrization):
    groups = param_groups(model, parametrization, total_tokens=TOTAL_TOKENS, batch_tokens=BATCH_TOKENS)
    return {group["name"]: group for group in groups}


def names_in(model, group):
    ids = {id(p) for p in group["params"]}
    return sorted(name for name, p in model.named_parameters() if id(p) in ids)


def test_groups_hold_exactly_the_expected_parameters():
    model = decoder(32, 2, pcfg())
    groups = groups_by_name(model, pcfg())
    assert sorted(groups) == ["embedding", "final_norm", "hidden", "norms_and_biases", "unembedding"]
    assert names_in(model, groups["embedding"]) == ["embed.weight"]
    assert names_in(model, groups["unembedding"]) == ["head.weight"]
    assert names_in(model, groups["final_norm"]) == ["norm.bias", "norm.weight"]
    linears = ("attn.qkv", "attn.proj", "ffn.up", "ffn.down")
    assert names_in(model, groups["hidden"]) == sorted(
        f"blocks.{i}.{linear}.weight" for i in range(2) for linear in linears)
    assert names_in(model, groups["norms_and_biases"]) == sorted(
        [f"blocks.{i}.{linear}.bias" for i in range(2) for linear in linears]
        + [f"blocks.{i}.{norm}.{p}" for i in range(2) for norm in ("attn_norm", "ffn_norm")
           for p in ("weight", "bias")])
    grouped = sum(len(g["params"]) for g in groups.values())
    assert grouped == len(list(model.parameters()))


def test_base_model_uses_the_base_hyperparameters():
    model = decoder(32, 2, pcfg())
    assert model.config.logit_multiplier == 1.0 and model.config.residual_multiplier == 1.0
    groups = groups_by_name(model, pcfg())
    # λ = B/(η·τ·D) = 1/(4e-3 · 0.25 · 1000) = 1.
    assert groups["hidden"]["weight_decay"] == pytest.approx(1.0)
    for name, group in groups.items():
        assert group["lr"] == pytest.approx(4e-3)
        assert group["eps"] == pytest.approx(1e-8)
        if name != "hidden":
            assert group["weight_decay"] == 0.0


def test_twice_wide_and_deep_model_follows_table_a2():
    parametrization = pcfg()
    model = decoder(64, 4, parametrization)
    assert model.config.logit_multiplier == pytest.approx(0.5)  # 1/m_d
    assert model.config.residual_multiplier == pytest.approx(0.5)  # 1/m_L
    groups = groups_by_name(model, parametrization)
    expected = {  # (lr, eps, weight decay) with m_d = m_L = 2
        "hidden": (2e-3, 2.5e-9, 1 / (2e-3 * 0.25 * STEPS)),
        "norms_and_biases": (4e-3, 2.5e-9, 0.0),
        "embedding": (4e-3, 5e-9, 0.0),
        "final_norm": (4e-3, 5e-9, 0.0),
        "unembedding": (4e-3, 5e-9, 0.0),
    }
    for name, (lr, eps, decay) in expected.items():
        assert (groups[name]["lr"], groups[name]["eps"], groups[name]["weight_decay"]) == \
            pytest.approx((lr, eps, decay), rel=1e-12), name
    assert groups["hidden"]["weight_decay"] == pytest.approx(2.0)


def test_standard_parametrization_has_no_multipliers():
    parametrization = pcfg("standard")
    cfg = model_config(64, 4, parametrization)
    assert model_multipliers(parametrization, cfg) == {"logit_multiplier": 1.0,
                                                       "residual_multiplier": 1.0}
    model = Decoder(cfg)
    groups = groups_by_name(model, parametrization)
    assert {(g["lr"], g["eps"]) for g in groups.values()} == {(4e-3, 1e-8)}
    assert groups["hidden"]["weight_decay"] == pytest.approx(1.0)
    init_decoder_(model, parametrization)
    hidden = torch.cat([p.flatten() for p in groups["hidden"]["params"]])
    assert hidden.std().item() == pytest.approx(0.02, rel=0.03)


def measured_std(tensors):
    return torch.cat([t.detach().flatten() for t in tensors]).std().item()


@pytest.mark.parametrize("width, depth, sigma", [(32, 2, 0.02), (64, 4, 0.02), (128, 2, 0.02), (64, 2, 0.5)])
def test_init_std_matches_the_rules(width, depth, sigma):
    """σ is decoder.init_std: the Table A.2 init starts from it (0.5 gives 25× 0.02's stds)."""
    parametrization = pcfg()
    model = decoder(width, depth, parametrization, vocab_size=512, init_std=sigma)
    for p in model.parameters():  # make sure init_decoder_ really writes every tensor
        torch.nn.init.constant_(p, 7.0)
    init_decoder_(model, parametrization, generator=torch.Generator().manual_seed(1))
    groups = groups_by_name(model, parametrization)
    m_d = width / 32
    assert measured_std(groups["hidden"]["params"]) == pytest.approx(sigma / math.sqrt(m_d), rel=0.03)
    assert measured_std([model.embed.weight]) == pytest.approx(sigma, rel=0.03)
    assert measured_std([model.head.weight]) == pytest.approx(sigma, rel=0.03)
    for name, p in model.named_parameters():
        if name.endswith("norm.weight"):
            assert torch.all(p == 1), name
        elif name.endswith("bias"):
            assert torch.all(p == 0), name
        else:
            assert p.abs().mean().item() < 7 * sigma, name


def test_init_is_reproducible_with_a_generator():
    first, second = decoder(32, 2, pcfg()), decoder(32, 2, pcfg())
    torch.manual_seed(123)  # the global RNG must not matter
    init_decoder_(first, pcfg(), generator=torch.Generator().manual_seed(5))
    init_decoder_(second, pcfg(), generator=torch.Generator().manual_seed(5))
    for a, b in zip(first.parameters(), second.parameters()):
        assert torch.equal(a, b)


def test_adamw_trains_with_the_groups():
    parametrization = pcfg()
    model = decoder(64, 4, parametrization)
    optimizer = adamw(model, parametrization, total_tokens=TOTAL_TOKENS, batch_tokens=BATCH_TOKENS)
    assert optimizer.defaults["betas"] == (0.9, 0.95)
    tokens = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(0))
    before = model.blocks[3].ffn.down.weight.detach().clone()
    loss = torch.nn.functional.cross_entropy(model(tokens).flatten(0, 1), tokens.flatten())
    loss.backward()
    optimizer.step()
    assert not torch.equal(before, model.blocks[3].ffn.down.weight)


def test_frozen_parameters_are_left_out():
    model = decoder(32, 2, pcfg())
    model.embed.weight.requires_grad_(False)
    assert "embedding" not in groups_by_name(model, pcfg())


def test_wrapper_prefixes_are_understood():
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    model = decoder(32, 2, pcfg())
    plain = groups_of(model)
    model.blocks[0] = checkpoint_wrapper(model.blocks[0])
    model.blocks[1] = torch.compile(model.blocks[1])  # compiles lazily: nothing runs here
    compiled = torch.compile(model)
    groups = groups_of(compiled)
    assert "_orig_mod.blocks.1._orig_mod.ffn.up.weight" in groups
    assert "_orig_mod.blocks.0._checkpoint_wrapped_module.attn.qkv.bias" in groups
    assert sorted(groups.values()) == sorted(plain.values())
    assert len(groups_by_name(compiled, pcfg())["hidden"]["params"]) == 8


def test_the_family_declares_the_groups_and_names_match_no_pattern():
    """A block's parameters are grouped by what holds them (a linear layer's weight is
    hidden; a norm's parameters and biases are not), whatever the names."""
    model = decoder(32, 2, pcfg())
    block = model.blocks[0]
    block.extra_norm = torch.nn.LayerNorm(32)  # a norm the block's family adds, by another name
    block.attn.gate = torch.nn.Linear(32, 32, bias=True)
    groups = groups_of(model)
    assert groups["blocks.0.extra_norm.weight"] == groups["blocks.0.extra_norm.bias"] == "norms_and_biases"
    assert (groups["blocks.0.attn.gate.weight"], groups["blocks.0.attn.gate.bias"]) == ("hidden", "norms_and_biases")


def test_an_unknown_parameter_in_the_model_raises_instead_of_landing_somewhere():
    model = decoder(32, 2, pcfg())
    model.register_parameter("gate", torch.nn.Parameter(torch.zeros(3)))
    with pytest.raises(ValueError, match="parameter 'gate' has no parametrization group"):
        groups_by_name(model, pcfg())
    with pytest.raises(ValueError, match="'gate'"):
        init_decoder_(model, pcfg())
    inside = decoder(32, 2, pcfg())
    inside.blocks[1].ffn.register_parameter("scale", torch.nn.Parameter(torch.ones(3)))  # in no linear or norm
    with pytest.raises(ValueError, match="parameter 'blocks.1.ffn.scale' has no parametrization group"):
        groups_by_name(inside, pcfg())


def test_model_without_the_multipliers_is_rejected():
    cfg = ModelConfig(vocab_size=64, d_model=64, n_layers=4, n_heads=4, max_seq_len=16)
    with pytest.raises(ValueError, match=r"logit_multiplier=1\.0 .* expected 0\.5"):
        param_groups(Decoder(cfg), pcfg(), total_tokens=TOTAL_TOKENS, batch_tokens=BATCH_TOKENS)


def test_not_a_decoder_is_rejected():
    with pytest.raises(ValueError, match="Linear has no ModelConfig"):
        init_decoder_(torch.nn.Linear(2, 2), pcfg())


def test_weight_decay_is_the_ema_timescale_rule():
    # τ_EMA = B/(η·λ·D): the AdamW EMA (1/(η·λ) steps) spans τ_EMA of the run.
    decay = weight_decay(1e-3, 0.2, batch_tokens=4096, total_tokens=4096 * 5000)
    assert 1 / (1e-3 * decay) / 5000 == pytest.approx(0.2)


def test_transfer_rules_follow_power_lines():
    assert transfer_batch_size(32, 1.0) == 32
    assert transfer_batch_size(32, 32.0) == pytest.approx(128)  # 32 · 32^0.4 = 32 · 4
    assert transfer_tau_ema(0.2, 20.0, 20.0) == pytest.approx(0.2)
    assert transfer_tau_ema(0.2, 80.0, 20.0) == pytest.approx(0.1)

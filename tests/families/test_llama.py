"""The Llama family against transformers' LlamaForCausalLM (fp32 logits ≤ 1e-5), and
the Decoder interface on it: exits, skip sets, layer dropout, KV cache under left
padding, FLOPs against torch's counter."""

from __future__ import annotations

import typing

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import framework.families.llama.blocks as llama
from framework.checkpoint import load_decoder
from framework.config import ModelConfig
from framework.families import FAMILY_NAMES
from framework.families.registry import build_decoder, new_block
from framework.flops import dense_step_flops, executed_step_flops
from framework.layer_dropout import DropPlan
from framework.model.decoder import Decoder
from tests.helpers import family_checks as checks
from tests.helpers.family_checks import naive_attention
from tests.helpers.hf_llama import LLAMA3_ROPE, VOCAB, tiny_hf_llama

SHAPES = {"gqa-untied": {}, "gqa-tied": {"tie": True}, "mha-llama3-rope": {"kv_heads": 4, "rope_scaling": LLAMA3_ROPE},
          "tied-llama3-sharded": {"tie": True, "rope_scaling": LLAMA3_ROPE, "shard": True}}


def loaded(tmp_path, **shape):
    hf = tiny_hf_llama(tmp_path / "hf", **shape)
    decoder, cfg = load_decoder(tmp_path / "hf")
    return hf, decoder, cfg


@pytest.mark.parametrize("shape", list(SHAPES), ids=str)
def test_logits_and_every_exit_equal_transformers(tmp_path, shape):
    checks.logits_and_exits_equal(tiny_hf_llama, tmp_path / "hf", **SHAPES[shape])
    if SHAPES[shape].get("shard"):
        assert (tmp_path / "hf" / "model.safetensors.index.json").is_file()


def test_llama3_scaling_changes_the_function(tmp_path):
    """The scaled band is reached: without the scaling the logits differ (so the test above can fail)."""
    hf = tiny_hf_llama(rope_scaling=LLAMA3_ROPE)
    decoder, cfg = loaded(tmp_path, rope_scaling=LLAMA3_ROPE)[1:]
    plain = build_decoder(ModelConfig(**{**cfg.to_dict(), "rope_type": "default"}))
    plain.load_state_dict(decoder.state_dict())
    tokens = torch.randint(0, VOCAB, (1, 64), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert (plain(tokens) - hf(tokens).logits).abs().max() > 1e-3


def test_skip_layers_equal_transformers_without_those_layers(tmp_path):
    hf, decoder, _ = loaded(tmp_path)
    tokens = torch.randint(0, VOCAB, (2, 20), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        expected = _hf_without(hf, tokens, skip={1, 2})
        assert (decoder(tokens, skip_layers=(1, 2)) - expected).abs().max() <= 1e-5


def _hf_without(hf, tokens, skip):
    layers = hf.model.layers
    hf.model.layers = torch.nn.ModuleList(layer for i, layer in enumerate(layers) if i not in skip)
    hf.config.num_hidden_layers = len(hf.model.layers)
    try:
        return hf(tokens, use_cache=False).logits
    finally:
        hf.model.layers, hf.config.num_hidden_layers = layers, len(layers)


def small_cfg(**overrides) -> ModelConfig:
    return ModelConfig(**{"family": "llama", "vocab_size": 50, "d_model": 32, "n_layers": 3, "n_heads": 4,
                          "n_kv_heads": 2, "ffn_hidden": 40, "bias": False, "max_seq_len": 64, **overrides})


def reference_plan_forward(model: Decoder, tokens: torch.Tensor, keep: list[torch.Tensor], scale: float):
    """Slow reference: each sequence alone, a dropped layer passes its residual through."""
    rows = []
    for b in range(tokens.shape[0]):
        x = tokens[b:b + 1]
        h = model.embed(x)
        bias = model.attention_bias(x.shape[1])
        for i, block in enumerate(model.blocks):
            if keep[i][b]:
                a = block.attn(block.attn_norm(h), bias, None)
                h = h + scale * a
                h = h + scale * block.ffn(block.ffn_norm(h))
        rows.append(model.logits(h))
    return torch.cat(rows)


def test_layer_dropout_runs_the_kept_rows_only():
    torch.manual_seed(0)
    model = build_decoder(small_cfg()).double()
    tokens = torch.randint(0, 50, (4, 12))
    keep = [torch.tensor([1, 0, 1, 1]).bool(), torch.zeros(4).bool(), torch.tensor([0, 1, 1, 0]).bool()]
    drop = DropPlan.from_masks(keep, [1.25] * 3)
    logits = model(tokens, plan=drop)
    assert torch.allclose(logits, reference_plan_forward(model, tokens, keep, 1.25), atol=1e-10)
    logits.sum().backward()  # a layer dropped on every row still has (zero) gradients
    assert model.blocks[1].attn.qkv.weight.grad is not None
    assert model.blocks[1].attn.qkv.weight.grad.abs().max() == 0


def test_cache_under_left_padding_gives_what_each_prompt_gives_alone():
    torch.manual_seed(0)
    model = build_decoder(small_cfg()).double().eval()
    prompts = [[5, 6, 7, 8, 9], [3, 4]]
    width = max(map(len, prompts))
    tokens = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    padding = torch.tensor([[True] * (width - len(p)) + [False] * len(p) for p in prompts])
    cache = model.new_cache(2, 16)
    with torch.no_grad():
        first = model(tokens, cache=cache, padding=padding)[:, -1]
        step = model(torch.tensor([[11], [12]]), cache=cache)[:, -1]
        for row, prompt in enumerate(prompts):
            alone = model(torch.tensor([prompt + [11 + row]]))
            assert torch.allclose(first[row], alone[0, -2], atol=1e-10)
            assert torch.allclose(step[row], alone[0, -1], atol=1e-10)


def test_a_cache_of_grouped_heads_holds_the_kv_heads_only():
    model = build_decoder(small_cfg())
    assert model.new_cache(2, 8).keys[0].shape == (2, 2, 8, 8)


@pytest.mark.parametrize("tie", [False, True])
def test_flops_equal_torch_flop_counter(monkeypatch, tie):
    monkeypatch.setattr(llama, "causal_attention", naive_attention)
    cfg = small_cfg(tie_embeddings=tie)
    model = build_decoder(cfg)
    tokens = torch.randint(0, 50, (4, 10))
    keep = [torch.tensor([1, 0, 1, 1]).bool(), torch.zeros(4).bool(), torch.ones(4).bool()]
    drop = DropPlan.from_masks(keep, [1.0] * 3)
    for plan, expected in ((None, dense_step_flops(cfg, 4, 10, causal=False)),
                           (drop, executed_step_flops(cfg, drop.kept_counts(), 10, batch_size=4, causal=False))):
        with FlopCounterMode(display=False) as counter:
            model(tokens, plan=plan).sum().backward()
        assert counter.get_total_flops() == expected.total


def test_tied_embeddings_share_one_matrix_and_count_once():
    tied, untied = build_decoder(small_cfg(tie_embeddings=True)), build_decoder(small_cfg())
    assert tied.head.weight is tied.embed.weight
    assert untied.num_parameters() - tied.num_parameters() == 50 * 32
    assert tied.num_parameters(non_embedding=True) == untied.num_parameters(non_embedding=True)
    with torch.device("meta"):
        meta = build_decoder(small_cfg(tie_embeddings=True))
    moved = meta.to_empty(device="cpu")
    moved.reset_buffers()
    assert moved.head.weight is moved.embed.weight


def test_the_registry_builds_each_family_and_its_blocks():
    assert set(FAMILY_NAMES) == set(typing.get_args(typing.get_type_hints(ModelConfig)["family"]))
    assert {"celerity", "llama"} <= set(FAMILY_NAMES)
    assert type(build_decoder(small_cfg())).__name__ == "LlamaDecoder"
    assert type(new_block(small_cfg(), 3)).__name__ == "LlamaBlock"
    with pytest.raises(ValueError, match="build_decoder"):
        Decoder(small_cfg())


@pytest.mark.parametrize("field, value, message", [
    ("n_kv_heads", 3, "n_kv_heads=3 is invalid: must divide n_heads=4"),
    ("bias", True, "bias=True is invalid for family='llama'"),
    ("rope_type", "yarn", "rope_type='yarn' is invalid"),
])
def test_bad_llama_fields_are_refused_in_one_line(field, value, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        small_cfg(**{field: value})


@pytest.mark.parametrize("field, value", [("rope_theta", 5e5), ("tie_embeddings", True), ("rope_type", "llama3")])
def test_celerity_refuses_the_llama_fields_it_would_ignore(field, value):
    with pytest.raises(ValueError, match=f"{field}=.* is invalid for family='celerity': it is a field of .*llama"):
        ModelConfig(n_heads=4, **{field: value})


def test_celerity_refuses_grouped_query_attention_and_honours_the_ffn_width():
    with pytest.raises(ValueError, match="n_kv_heads=1 is invalid for family='celerity'"):
        ModelConfig(n_heads=4, n_kv_heads=1)
    decoder = build_decoder(ModelConfig(vocab_size=50, d_model=32, n_layers=1, n_heads=4, ffn_hidden=100))
    assert decoder.blocks[0].ffn.up.weight.shape == (100, 32)


@pytest.mark.slow
@pytest.mark.parametrize("wrap", [{"compile": True}, {"activation_checkpointing": True}], ids=str)
def test_compiled_and_checkpointed_llama_blocks_train_as_eager(wrap):
    """GQA + SwiGLU + RoPE blocks under torch.compile or activation checkpointing train as eager."""
    checks.wrapped_blocks_train_as_eager(small_cfg(tie_embeddings=True, rope_type="llama3", rope_original_max_seq_len=16),
                                         wrap)

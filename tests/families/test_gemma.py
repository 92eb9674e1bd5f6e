"""The Gemma family (GeGLU, embeddings × √d, RMSNorm scaled by 1 + w) against transformers'
GemmaForCausalLM made from a small config: the checks of tests/helpers/family_checks.py,
its config refusals, its parametrization groups and init."""

from __future__ import annotations

import json
import math

import pytest
import torch
from transformers import GemmaConfig, GemmaForCausalLM

from framework.checkpoint import CheckpointError, read_model_config
from framework.config import ModelConfig, ParametrizationConfig
from framework.families.registry import build_decoder
from framework.training.parametrization import groups_of, init_decoder_, param_groups
from tests.helpers import family_checks as checks
from tests.helpers.hf_llama import VOCAB

SHAPES = {"untied": {"tie": False}, "tied": {}, "tied-sharded": {"shard": True}}


def tiny_hf_gemma(folder=None, *, seed=0, shard=False, tie=True, std=0.02, layers=4, norm_std=0.3):
    """A random GemmaForCausalLM (eval mode; multi-query heads, a head_dim of its own),
    saved to ``folder`` when given. The norm weights are drawn too (transformers starts
    them at 0, which would let a norm that drops its 1 + w pass)."""
    torch.manual_seed(seed)
    config = GemmaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=88, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=1, head_dim=24, max_position_embeddings=256,
                         tie_word_embeddings=tie, initializer_range=std, bos_token_id=None, eos_token_id=None,
                         pad_token_id=None)
    model = GemmaForCausalLM(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.copy_(torch.randn_like(param) * norm_std)
    if folder is not None:
        model.save_pretrained(folder, max_shard_size="40KB" if shard else "5GB")
    return model


@pytest.mark.parametrize("shape", list(SHAPES))
def test_logits_and_exits_equal_transformers_with_left_padding(tmp_path, shape):
    checks.logits_and_exits_equal(tiny_hf_gemma, tmp_path / "hf", **SHAPES[shape])
    assert read_model_config(tmp_path / "hf").family == "gemma"


def test_greedy_generation_is_token_identical_to_transformers(tmp_path):
    checks.greedy_generation_identical(tiny_hf_gemma, tmp_path / "hf")


def test_self_speculative_decoding_is_lossless(tmp_path):
    checks.speculative_decoding_is_lossless(tiny_hf_gemma, tmp_path / "hf")


def test_skip_layers_and_layer_dropout(tmp_path):
    checks.skip_layers_equal(tiny_hf_gemma, tmp_path / "a")
    checks.layer_dropout_runs_kept_rows(tiny_hf_gemma, tmp_path / "b")


@pytest.mark.parametrize("tie", [False, True])
def test_flops_equal_torch_flop_counter(tmp_path, monkeypatch, tie):
    checks.flops_equal_torch_counter(tiny_hf_gemma, tmp_path / "hf", monkeypatch, tie=tie)


@pytest.mark.parametrize("tie", [False, True])
def test_export_round_trip_is_bit_identical(tmp_path, tie):
    checks.export_round_trip_is_bit_identical(tiny_hf_gemma, tmp_path / "hf", tmp_path / "out", tie=tie)


def edited(tmp_path, **fields):
    folder = tmp_path / "hf"
    tiny_hf_gemma(folder, layers=2)
    config = json.loads((folder / "config.json").read_text())
    config.update(fields)
    (folder / "config.json").write_text(json.dumps({k: v for k, v in config.items() if v != "DROP"}))
    return folder


@pytest.mark.parametrize("fields, message", [
    ({"hidden_act": "silu"}, "hidden_act='silu' is not supported: allowed: 'gelu_pytorch_tanh', 'gelu'"),
    ({"use_bidirectional_attention": True}, "use_bidirectional_attention=True is not supported"),
    ({"attention_bias": True}, "attention_bias=True is not supported: allowed: False"),
    ({"head_dim": "DROP"}, "the field 'head_dim' is missing"),
])
def test_what_gemma_cannot_represent_is_refused_in_one_line(tmp_path, fields, message):
    with pytest.raises(CheckpointError, match=message) as err:
        read_model_config(edited(tmp_path, **fields))
    assert "\n" not in str(err.value)


def test_the_first_releases_gelu_and_an_absent_tie_read_as_gemma_does(tmp_path):
    cfg = read_model_config(edited(tmp_path, hidden_act="gelu", tie_word_embeddings="DROP"))
    assert cfg.tie_embeddings and cfg.family == "gemma"


def test_parametrization_groups_and_init_cover_the_family():
    cfg = ModelConfig(family="gemma", vocab_size=50, d_model=32, n_layers=2, n_heads=4, n_kv_heads=1, head_dim=12,
                      ffn_hidden=40, bias=False, tie_embeddings=True)
    decoder = build_decoder(cfg)
    groups = groups_of(decoder)
    assert {groups[n] for n in groups if "norm" in n and n.startswith("blocks.")} == {"norms_and_biases"}
    assert groups["norm.weight"] == "final_norm" and "head.weight" not in groups  # tied: the embedding
    with torch.no_grad():
        for p in decoder.parameters():
            p.fill_(0.5)
    init_decoder_(decoder, ParametrizationConfig(d_base=32, n_layers_base=2))
    for name, p in decoder.named_parameters():
        if name.endswith("norm.weight"):
            assert torch.all(p == 0), name  # Gemma's identity: a scale of 1 + 0
    tokens = torch.randint(0, 50, (1, 5))
    assert torch.allclose(decoder.embed(tokens), decoder.embed.weight[tokens] * math.sqrt(32))
    total = sum(len(g["params"]) for g in param_groups(decoder, ParametrizationConfig(d_base=32, n_layers_base=2),
                                                        total_tokens=1e6, batch_tokens=1e3))
    assert total == len(list(decoder.parameters()))


@pytest.mark.slow
@pytest.mark.parametrize("wrap", [{"compile": True}, {"activation_checkpointing": True}], ids=str)
def test_compiled_and_checkpointed_blocks_train_as_eager(wrap):
    # Untied: the tied embedding's gradient (× √d, and the head's besides) differs from eager
    # by inductor's reordered sums at ~1e-6 absolute, the check's own tolerance.
    checks.wrapped_blocks_train_as_eager(ModelConfig(family="gemma", vocab_size=50, d_model=32, n_layers=3, n_heads=4,
                                                     n_kv_heads=1, head_dim=12, ffn_hidden=40, bias=False,
                                                     max_seq_len=64), wrap)

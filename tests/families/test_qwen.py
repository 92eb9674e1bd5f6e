"""The Qwen2 (qkv bias) and Qwen3 (per-head q/k norms, explicit head_dim) families against
transformers' Qwen2ForCausalLM / Qwen3ForCausalLM made from small configs: the checks of
tests/helpers/family_checks.py, their config refusals, their parametrization groups,
the memory model and continued pretraining from a Qwen folder."""

from __future__ import annotations

import json
import shutil
from functools import partial

import pytest
import torch

from framework.checkpoint import CheckpointError, load_decoder, read_model_config
from framework.config import ModelConfig, ParametrizationConfig
from framework.families.registry import build_decoder
from framework.training.parametrization import NORMS_AND_BIASES, groups_of, init_decoder_, param_groups
from tests.helpers import family_checks as checks
from tests.helpers.hf_qwen import tiny_hf_qwen

KINDS = ["qwen2", "qwen3"]
SHAPES = {"untied": {}, "tied": {"tie": True}, "tied-sharded": {"tie": True, "shard": True}}


def maker(kind):
    return partial(tiny_hf_qwen, kind)


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("kind", KINDS)
def test_logits_and_exits_equal_transformers_with_left_padding(tmp_path, kind, shape):
    checks.logits_and_exits_equal(maker(kind), tmp_path / "hf", **SHAPES[shape])
    if SHAPES[shape].get("shard"):
        assert (tmp_path / "hf" / "model.safetensors.index.json").is_file()


@pytest.mark.parametrize("kind", KINDS)
def test_greedy_generation_is_token_identical_to_transformers(tmp_path, kind):
    checks.greedy_generation_identical(maker(kind), tmp_path / "hf")


@pytest.mark.parametrize("kind", KINDS)
def test_self_speculative_decoding_is_lossless(tmp_path, kind):
    checks.speculative_decoding_is_lossless(maker(kind), tmp_path / "hf")


@pytest.mark.parametrize("mode", ["speculative", "dynamic", "adapter"])
def test_generate_runs_the_depth_routes_on_a_qwen3_folder(tmp_path, prepared_tokens, capsys, mode):
    """``layerdrop generate`` on a Qwen3 folder: the speculative, dynamic-exit and
    exit-adapter routes (adapters fitted by ``layerdrop adapters fit`` on the folder)."""
    from framework.cli import main as layerdrop

    folder = tmp_path / "hf"
    tiny_hf_qwen("qwen3", folder, vocab=300, tie=True)
    shutil.copy(prepared_tokens / "tokenizer.json", folder / "tokenizer.json")
    args = ["generate", "--ckpt", str(folder), "--prompt", "def main(", "--max-new-tokens", "6", "--mode", mode]
    if mode == "adapter":
        assert layerdrop(["adapters", "fit", "--ckpt", str(folder), "--data", str(prepared_tokens), "--out",
                          str(tmp_path / "a"), "--exits", "2", "--max-steps", "2", "--batch-size", "2",
                          "--seq-len", "32"]) == 0
        args[-1:] = ["speculative", "--draft", "adapter:2", "--adapters", str(tmp_path / "a")]
    elif mode == "dynamic":
        args += ["--threshold", "0.5"]
    assert layerdrop(args) == 0
    assert "tokens/s" in capsys.readouterr().err


@pytest.mark.parametrize("kind", KINDS)
def test_skip_layers_and_layer_dropout(tmp_path, kind):
    checks.skip_layers_equal(maker(kind), tmp_path / "a")
    checks.layer_dropout_runs_kept_rows(maker(kind), tmp_path / "b")


@pytest.mark.parametrize("tie", [False, True])
@pytest.mark.parametrize("kind", KINDS)
def test_flops_equal_torch_flop_counter(tmp_path, monkeypatch, kind, tie):
    checks.flops_equal_torch_counter(maker(kind), tmp_path / "hf", monkeypatch, tie=tie)


@pytest.mark.parametrize("tie", [False, True])
@pytest.mark.parametrize("kind", KINDS)
def test_export_round_trip_is_bit_identical(tmp_path, kind, tie):
    checks.export_round_trip_is_bit_identical(maker(kind), tmp_path / "hf", tmp_path / "out", tie=tie)


@pytest.mark.slow
@pytest.mark.parametrize("wrap", [{"compile": True}, {"activation_checkpointing": True}], ids=str)
@pytest.mark.parametrize("kind", KINDS)
def test_compiled_and_checkpointed_blocks_train_as_eager(kind, wrap):
    checks.wrapped_blocks_train_as_eager(ModelConfig(family=kind, vocab_size=50, d_model=32, n_layers=3, n_heads=4,
                                                     n_kv_heads=2, head_dim=12, ffn_hidden=40, bias=False,
                                                     max_seq_len=64, tie_embeddings=True), wrap)


def test_the_family_parts_are_there(tmp_path):
    tiny_hf_qwen("qwen2", tmp_path / "q2")
    tiny_hf_qwen("qwen3", tmp_path / "q3")
    q2, q3 = load_decoder(tmp_path / "q2")[0], load_decoder(tmp_path / "q3")[0]
    assert q2.blocks[0].attn.qkv.bias.shape == (8 * 16,)  # 4 query + 2 + 2 K/V heads of 16
    assert q3.blocks[0].attn.qkv.bias is None and q3.config.head_dim == 24 != 64 // 4
    assert q3.blocks[0].attn.q_norm.weight.shape == q3.blocks[0].attn.k_norm.weight.shape == (24,)


def edited(tmp_path, kind, **fields):
    tiny_hf_qwen(kind, tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    config.update(fields)
    for key in [k for k, v in fields.items() if v is None]:
        del config[key]
    (tmp_path / "hf" / "config.json").write_text(json.dumps(config))
    return tmp_path / "hf"


@pytest.mark.parametrize("kind, fields, message", [
    ("qwen2", {"use_sliding_window": True}, "use_sliding_window=True is not supported: allowed: false"),
    ("qwen3", {"use_sliding_window": True}, "use_sliding_window=True is not supported: allowed: false"),
    ("qwen2", {"layer_types": ["full_attention", "sliding_attention", "full_attention", "full_attention"]},
     "layer_types[1]='sliding_attention' is not supported"),
    ("qwen3", {"attention_bias": True}, "attention_bias=True is not supported"),
    ("qwen3", {"head_dim": None}, "the field 'head_dim' is missing"),
    ("qwen2", {"architectures": ["Qwen3ForCausalLM"]}, "architectures=['Qwen3ForCausalLM'] is not supported"),
])
def test_what_the_family_cannot_represent_is_refused_in_one_line(tmp_path, kind, fields, message):
    with pytest.raises(CheckpointError, match=message.replace("[", r"\[").replace("]", r"\]")) as err:
        read_model_config(edited(tmp_path, kind, **fields))
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("kind", KINDS)
def test_sliding_window_off_with_its_leftover_fields_is_accepted(tmp_path, kind):
    folder = edited(tmp_path, kind, use_sliding_window=False, sliding_window=4096, max_window_layers=2)
    assert read_model_config(folder).family == kind


@pytest.mark.parametrize("kind", KINDS)
def test_parametrization_groups_and_init_cover_the_family(kind):
    cfg = ModelConfig(family=kind, vocab_size=50, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_hidden=40,
                      head_dim=12, bias=False)
    decoder = build_decoder(cfg)
    own = [n for n, _ in decoder.named_parameters() if n.endswith(("qkv.bias", "q_norm.weight", "k_norm.weight"))]
    assert own and {groups_of(decoder)[n] for n in own} == {NORMS_AND_BIASES}
    pcfg = ParametrizationConfig(d_base=32, n_layers_base=2)
    with torch.no_grad():
        for name, p in decoder.named_parameters():
            p.fill_(0.5)
    init_decoder_(decoder, pcfg)
    for name, p in decoder.named_parameters():
        if name.endswith("bias"):
            assert torch.all(p == 0), name
        elif name.endswith("norm.weight"):
            assert torch.all(p == 1), name
    groups = param_groups(decoder, pcfg, total_tokens=1e6, batch_tokens=1e3)
    assert sum(len(g["params"]) for g in groups) == len(list(decoder.parameters()))


def test_continued_pretraining_from_a_qwen_folder_runs_and_exports_as_qwen(tmp_path, prepared_tokens):
    from transformers import AutoModelForCausalLM

    from framework.training.pretrain import main
    from tests.families.test_llama_continued import cpu_args

    folder = tmp_path / "hf"
    tiny_hf_qwen("qwen3", folder, vocab=300, tie=True, layers=3)
    shutil.copy(prepared_tokens / "tokenizer.json", folder / "tokenizer.json")
    root = tmp_path / "run"
    assert main(cpu_args(folder, prepared_tokens, root, steps=4)) == 0
    trained, cfg = load_decoder(root / "export")
    assert cfg.family == "qwen3" and cfg.head_dim == 24
    original = load_decoder(folder)[0]
    moved = max((a - b).abs().max() for a, b in zip(original.state_dict().values(), trained.state_dict().values()))
    assert moved > 0  # it trained, from the folder's weights
    from framework.checkpoint.export import main as export

    assert export(["--ckpt", str(root / "export"), "--out", str(tmp_path / "hf-out"), "--format", "hf",
                   "--no-tokenizer"]) == 0
    assert type(AutoModelForCausalLM.from_pretrained(tmp_path / "hf-out")).__name__ == "Qwen3ForCausalLM"


@pytest.mark.parametrize("kind", KINDS)
def test_the_recipe_command_prices_a_qwen_base_by_its_own_activations(tmp_path, monkeypatch, capsys, kind):
    """``layerdrop recipe`` on a Qwen base (Qwen2.5-1.5B-like: 12 query heads on 2 K/V heads
    of 128, Qwen3 with q/k norms): the family is kept and its memory model is its own."""
    import re

    import yaml

    from framework.families.registry import family_spec
    from framework.recipes.recipe import main as recipe
    from tests.recipes.test_recipe import RECIPES, REPO

    monkeypatch.chdir(REPO)
    base = yaml.safe_load((RECIPES / "base.yaml").read_text())
    base["model"]["decoder"].update(family=kind, bias=False, attention="sdpa", n_kv_heads=2, head_dim=128,
                                    n_heads=12, ffn_hidden=8960, tie_embeddings=True, rope_theta=1e6)
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(base))
    capsys.readouterr()
    code = recipe(["--base", str(tmp_path / "base.yaml"), "--d-model", "1536", "--n-layers", "28", "--heads", "12",
                   "--head-dim", "128", "--kv-heads", "2", "--ffn-hidden", "8960", "--tpp", "20", "--memory", "141GB"])
    out, err = capsys.readouterr()
    assert code == 0, err
    recipe_yaml = yaml.safe_load(out)
    model = ModelConfig(**recipe_yaml["model"]["decoder"])
    assert (model.family, model.n_kv_heads, model.head_dim) == (kind, 2, 128)
    line = next(line for line in out.splitlines() if line.startswith("#   memory per device"))
    activations = float(re.search(r"activations ([0-9.]+)", line).group(1))
    per_token = family_spec(kind).activation_bytes_per_token(model, True)
    assert activations == pytest.approx(recipe_yaml["data"]["batch_size"] * 2048 * 28 * per_token / 1e9, abs=0.05)

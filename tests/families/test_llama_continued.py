"""Continued pretraining from a Hugging Face folder (``--model.init_from``) with layer
dropout: the run starts from the folder's weights and lowers their loss; what it ends
with loads back into transformers."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from transformers import AutoModelForCausalLM

from framework.checkpoint import load_decoder
from framework.training.pretrain import main
from tests.helpers.hf_llama import heldout_tokens, loss_of, tiny_hf_llama

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "llama-continued.yaml"


def cpu_args(hf_dir, data_dir, root, *, steps=12, p_max=0.4):
    """recipes/llama-continued.yaml shrunk to seconds on a CPU."""
    return ["--config", str(RECIPE), "--model.init_from", str(hf_dir), "--data.data_dir", str(data_dir),
            "--trainer.default_root_dir", str(root), "--trainer.accelerator", "cpu", "--trainer.devices", "1",
            "--trainer.strategy", "auto", "--trainer.precision", "32-true", "--trainer.max_steps", str(steps),
            "--trainer.val_check_interval", str(steps), "--trainer.limit_val_batches", "2",
            "--trainer.log_every_n_steps", "1", "--trainer.enable_progress_bar", "false",
            "--trainer.enable_model_summary", "false", "--model.layer_dropout.p_max", str(p_max),
            "--model.parametrization.lr", "3e-3", "--model.lr_schedule.warmup_steps", "1",
            "--model.activation_checkpointing", "false", "--data.seq_len", "32", "--data.batch_size", "4",
            "--data.num_workers", "0", "--data.val_batches", "2", "--checkpoint.every_n_steps", str(steps)]


@pytest.fixture
def hf_dir(tmp_path, prepared_tokens):
    folder = tmp_path / "hf"
    tiny_hf_llama(folder, vocab=300, tie=True, layers=3)
    shutil.copy(prepared_tokens / "tokenizer.json", folder / "tokenizer.json")
    return folder


def test_continued_pretraining_from_an_hf_folder_lowers_its_loss(tmp_path, prepared_tokens, hf_dir):
    root = tmp_path / "run"
    assert main(cpu_args(hf_dir, prepared_tokens, root)) == 0
    tokens = heldout_tokens(prepared_tokens)
    original, _ = load_decoder(hf_dir)
    trained, cfg = load_decoder(root / "export")
    assert cfg.family == "llama" and cfg.tie_embeddings and cfg.logit_multiplier == cfg.residual_multiplier == 1.0
    with torch.no_grad():
        before, after = loss_of(original(tokens), tokens), loss_of(trained(tokens), tokens)
        assert after < before - 0.3
        # It started from the folder's weights, not from a fresh init.
        cosine = torch.nn.functional.cosine_similarity(original.embed.weight.flatten(), trained.embed.weight.flatten(), 0)
        assert cosine > 0.8
    summary = json.loads((root / "summary.json").read_text())
    assert summary  # the run's record exists
    hf = AutoModelForCausalLM.from_pretrained(hf_dir)  # the input folder is untouched and still loads
    assert hf.config.num_hidden_layers == 3


def test_init_from_refuses_a_model_that_is_not_its_own_base(tmp_path, hf_dir):
    from framework.config import ModelConfig, ParametrizationConfig
    from framework.training.module import LayerDropModule

    decoder, cfg = load_decoder(hf_dir)
    with pytest.raises(ValueError, match="its own parametrization base"):
        LayerDropModule(cfg, parametrization=ParametrizationConfig(d_base=32, n_layers_base=3), init_from=str(hf_dir))
    other = ModelConfig(**{**cfg.to_dict(), "n_kv_heads": 4})
    with pytest.raises(ValueError, match="holds another model than model.decoder"):
        LayerDropModule(other, parametrization=ParametrizationConfig(d_base=64, n_layers_base=3), init_from=str(hf_dir))


def _header_only_safetensors(path, cfg_of) -> None:
    """A safetensors file of Llama's tensors at the config's shapes (bf16) whose data is a
    hole: the folder check reads its header, and the weights are not read before fit, so
    2.5 GB of zeros need no disk (a sparse file)."""
    import struct

    c = json.loads(cfg_of.read_text())
    d, ffn, heads, kv, hd = (c["hidden_size"], c["intermediate_size"], c["num_attention_heads"],
                             c["num_key_value_heads"], c["head_dim"])
    shapes = {"model.embed_tokens.weight": [c["vocab_size"], d], "model.norm.weight": [d]}
    for i in range(c["num_hidden_layers"]):
        block = f"model.layers.{i}."
        shapes |= {block + "self_attn.q_proj.weight": [heads * hd, d], block + "self_attn.k_proj.weight": [kv * hd, d],
                   block + "self_attn.v_proj.weight": [kv * hd, d], block + "self_attn.o_proj.weight": [d, heads * hd],
                   block + "mlp.gate_proj.weight": [ffn, d], block + "mlp.up_proj.weight": [ffn, d],
                   block + "mlp.down_proj.weight": [d, ffn], block + "input_layernorm.weight": [d],
                   block + "post_attention_layernorm.weight": [d]}
    header, offset = {}, 0
    for name, shape in shapes.items():
        size = 2 * math.prod(shape)
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    encoded = json.dumps(header).encode()
    encoded += b" " * (-len(encoded) % 8)
    with open(path, "wb") as file:
        file.write(struct.pack("<Q", len(encoded)) + encoded)
        file.truncate(8 + len(encoded) + offset)


def test_the_recipe_builds_a_llama_3_2_1b_shape_with_multipliers_one(tmp_path):
    """recipes/llama-continued.yaml on Llama-3.2-1B's config.json (the weights are not
    read before fit: a placeholder file stands for them), built on the meta device."""
    from transformers import LlamaConfig

    from tests.recipes.test_recipes import instantiate, parameters_on_meta

    folder = tmp_path / "Llama-3.2-1B"
    LlamaConfig(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                num_attention_heads=32, num_key_value_heads=8, head_dim=64, max_position_embeddings=131072,
                rms_norm_eps=1e-5, tie_word_embeddings=True, rope_theta=500000.0,
                rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                              "original_max_position_embeddings": 8192},
                bos_token_id=128000, eos_token_id=128001).save_pretrained(folder)
    _header_only_safetensors(folder / "model.safetensors", cfg_of=folder / "config.json")
    cli = instantiate(RECIPE, "--model.init_from", str(folder))
    cfg = cli.model.model_cfg
    assert (cfg.family, cfg.n_kv_heads, cfg.rope_type, cfg.rope_factor, cfg.tie_embeddings) == \
        ("llama", 8, "llama3", 32.0, True)
    assert cfg.logit_multiplier == cfg.residual_multiplier == 1.0
    assert cli.datamodule.model_vocab_size == 128256
    assert parameters_on_meta(cli) == 1_235_814_400  # Llama-3.2-1B's published count


def test_the_recipe_fits_an_h200_and_recomputes_only_where_it_must():
    """The memory model (framework/recipes/device_memory.py, Llama's block activations) on the
    recipe's layout: it fits 90% of an H200, and it checkpoints activations only if the
    step would not fit without (layerdrop recipe's rule)."""
    from framework.config import ModelConfig
    from framework.recipes.device_memory import ModelSizes, device_memory
    from framework.recipes.recipe import HEADROOM
    from framework.strategies import STRATEGIES

    # Llama-3.2-1B's shape, as the test above reads it from its config.json
    cfg = ModelConfig(family="llama", vocab_size=128256, d_model=2048, n_layers=16, n_heads=32, n_kv_heads=8,
                      head_dim=64, ffn_hidden=8192, tie_embeddings=True, bias=False, max_seq_len=2048)
    recipe = yaml.safe_load(RECIPE.read_text())
    trainer, data, model = recipe["trainer"], recipe["data"], recipe["model"]
    footprint = STRATEGIES[trainer["strategy"]].footprint(trainer["devices"], trainer["num_nodes"])

    def needed(checkpointing: bool) -> float:
        return sum(device_memory(ModelSizes.of(cfg), footprint, micro_batch=data["batch_size"], seq_len=data["seq_len"],
                                 checkpointing=checkpointing, loss_chunk_tokens=model["loss_chunk_tokens"],
                                 mixed=trainer["precision"] == "bf16-mixed").values())

    usable = HEADROOM * 141e9
    assert needed(model["activation_checkpointing"]) <= usable
    assert model["activation_checkpointing"] == (needed(False) > usable)

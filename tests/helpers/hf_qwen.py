"""Tiny random Hugging Face Qwen2 and Qwen3 models saved with ``save_pretrained`` (nothing
downloads): grouped-query attention (4 query heads on 2 K/V heads), Qwen3 with a
head_dim other than hidden_size / heads."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

from tests.helpers.hf_llama import VOCAB

KINDS = {"qwen2": (Qwen2Config, Qwen2ForCausalLM, {}), "qwen3": (Qwen3Config, Qwen3ForCausalLM, {"head_dim": 24})}


def tiny_qwen_config(kind: str, *, tie: bool = False, layers: int = 4, std: float = 0.02, vocab: int = VOCAB, **extra):
    config_class, _, own = KINDS[kind]
    return config_class(vocab_size=vocab, hidden_size=64, intermediate_size=88, num_hidden_layers=layers,
                        num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=tie,
                        max_position_embeddings=256, rope_theta=1_000_000.0, initializer_range=std,
                        use_sliding_window=False, bos_token_id=None, eos_token_id=None, pad_token_id=None,
                        **{**own, **extra})


def tiny_hf_qwen(kind: str, folder: Path | None = None, *, seed: int = 0, shard: bool = False, bias_std: float = 0.3,
                 **config):
    """A random Qwen2/Qwen3ForCausalLM (eval mode), saved to ``folder`` when given. The
    q/k/v biases and the q/k norm weights are drawn too (transformers starts them at 0
    and 1, which would let a mapping that drops them pass)."""
    torch.manual_seed(seed)
    model = KINDS[kind][1](tiny_qwen_config(kind, **config)).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(("proj.bias", "q_norm.weight", "k_norm.weight")):
                param.add_(torch.randn_like(param) * bias_std)
    if folder is not None:
        model.save_pretrained(folder, max_shard_size="40KB" if shard else "5GB")
    return model

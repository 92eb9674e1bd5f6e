"""Tiny random Hugging Face Llamas saved with ``save_pretrained`` (nothing downloads), and
the held-out loss the continued-pretraining tests compare."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from transformers import LlamaConfig, LlamaForCausalLM

VOCAB = 97
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 32}  # short, so that the scaled band is reached


def tiny_hf_config(*, tie: bool = False, kv_heads: int = 2, rope_scaling: dict | None = None, layers: int = 4,
                   vocab: int = VOCAB, std: float = 0.02, **extra) -> LlamaConfig:
    return LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=88, num_hidden_layers=layers,
                       num_attention_heads=4, num_key_value_heads=kv_heads, tie_word_embeddings=tie,
                       max_position_embeddings=256, rope_scaling=rope_scaling,
                       rope_theta=500_000.0 if rope_scaling else 10_000.0, initializer_range=std,
                       bos_token_id=None, eos_token_id=None, pad_token_id=None, **extra)


def tiny_hf_llama(folder: Path | None = None, *, seed: int = 0, shard: bool = False, **config) -> LlamaForCausalLM:
    """A random LlamaForCausalLM (eval mode), saved to ``folder`` when given
    (``shard``: in several safetensors files with an index)."""
    torch.manual_seed(seed)
    model = LlamaForCausalLM(tiny_hf_config(**config)).eval()
    if folder is not None:
        model.save_pretrained(folder, max_shard_size="40KB" if shard else "5GB")
    return model


def heldout_tokens(data_dir: Path, rows: int = 8, width: int = 33) -> torch.Tensor:
    """Real validation tokens, straight from the litdata chunks."""
    from litdata import StreamingDataset, TokensLoader

    data = StreamingDataset(str(data_dir / "val"), item_loader=TokensLoader(block_size=width))
    return torch.stack([torch.as_tensor(np.asarray(data[i])).long() for i in range(rows)])


def loss_of(logits: torch.Tensor, tokens: torch.Tensor) -> float:
    return float(torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]),
                                                   tokens[:, 1:].reshape(-1)))

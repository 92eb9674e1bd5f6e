"""The Llama family's own config fields (qwen2, qwen3 and the other families built on its
blocks share them): tying and RoPE. ``ModelConfig`` holds them beside the fields every
family shares (framework/families/__init__.py gathers every family's ``ARGS``), so a recipe
sets them as ``model.decoder.rope_theta`` like any other decoder field.

Plain types only: framework/config.py checks them against these annotations while it is
still being imported, so this module imports nothing of the project; the bounds are
framework/families/llama/rules.py's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True, kw_only=True)
class LlamaArgs:
    """Args:
        tie_embeddings: the head is the embedding matrix (Hugging Face's tie_word_embeddings)
        rope_theta: RoPE's base θ (ω_i = θ^(-2i/D))
        rope_type: default, or llama3 (Llama-3.1's frequency scaling, with the four fields below)
        rope_factor: llama3: how much the low frequencies are stretched
        rope_low_freq_factor: llama3: wavelengths above original/low are stretched
        rope_high_freq_factor: llama3: wavelengths below original/high are kept
        rope_original_max_seq_len: llama3: the context length the wavelengths are measured against
    """

    tie_embeddings: bool = False
    rope_theta: float = 10_000.0
    rope_type: Literal["default", "llama3"] = "default"
    rope_factor: float = 8.0
    rope_low_freq_factor: float = 1.0
    rope_high_freq_factor: float = 4.0
    rope_original_max_seq_len: int = 8192


__all__ = ["LlamaArgs"]

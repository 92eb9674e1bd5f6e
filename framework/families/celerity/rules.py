"""The Celerity family's config rules: the RoPE families' fields would be ignored by
its blocks, so a value other than their default is refused rather than silently dropped."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

# Fields only the RoPE families (every other family) read.
ROPE_FAMILY_FIELDS = ("ffn_hidden", "tie_embeddings", "rope_theta", "rope_type", "rope_factor",
                      "rope_low_freq_factor", "rope_high_freq_factor", "rope_original_max_seq_len")


def check(cfg: Any) -> None:
    defaults = {f.name: f.default for f in fields(cfg)}
    for name in ROPE_FAMILY_FIELDS:
        if getattr(cfg, name) != defaults[name]:
            raise ValueError(f"{name}={getattr(cfg, name)!r} is invalid for family='celerity': "
                             "it is a field of the RoPE families (every family but celerity)")
    if cfg.n_kv_heads != cfg.n_heads:
        raise ValueError(f"n_kv_heads={cfg.n_kv_heads!r} is invalid for family='celerity': "
                         "grouped-query attention is a field of the RoPE families (every family but celerity)")

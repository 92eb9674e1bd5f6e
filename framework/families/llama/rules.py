"""The Llama family's config: its own fields (``ARGS``) and its rules, which the families
built on its blocks share."""

from __future__ import annotations

from typing import Any

from framework.families.llama.args import LlamaArgs

ARGS = LlamaArgs
POSITIVE = ("rope_theta", "rope_factor", "rope_low_freq_factor", "rope_high_freq_factor", "rope_original_max_seq_len")


def check(cfg: Any) -> None:
    for name in POSITIVE:
        if getattr(cfg, name) <= 0:
            raise ValueError(f"{name}={getattr(cfg, name)!r} is invalid: must be > 0")
    if cfg.bias:
        raise ValueError(f"bias=True is invalid for family={cfg.family!r}: its blocks have no biases beyond "
                         "the family's own; set bias: false")
    if cfg.attention == "flex":  # FlexAttention here is ALiBi's kernel; the RoPE families run SDPA (flash on CUDA)
        raise ValueError(f"attention='flex' is invalid for family={cfg.family!r}: allowed: auto, sdpa")
    if cfg.rope_type == "llama3" and cfg.rope_high_freq_factor <= cfg.rope_low_freq_factor:
        raise ValueError(f"rope_high_freq_factor={cfg.rope_high_freq_factor!r} is invalid: must be > "
                         f"rope_low_freq_factor={cfg.rope_low_freq_factor!r}")

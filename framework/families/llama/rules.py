"""The config rules of the Llama family, which the families built on its blocks share."""

from __future__ import annotations

from typing import Any


def check(cfg: Any) -> None:
    if cfg.bias:
        raise ValueError(f"bias=True is invalid for family={cfg.family!r}: its blocks have no biases beyond "
                         "the family's own; set bias: false")
    if cfg.attention == "flex":  # FlexAttention here is ALiBi's kernel; the RoPE families run SDPA (flash on CUDA)
        raise ValueError(f"attention='flex' is invalid for family={cfg.family!r}: allowed: auto, sdpa")
    if cfg.rope_type == "llama3" and cfg.rope_high_freq_factor <= cfg.rope_low_freq_factor:
        raise ValueError(f"rope_high_freq_factor={cfg.rope_high_freq_factor!r} is invalid: must be > "
                         f"rope_low_freq_factor={cfg.rope_low_freq_factor!r}")

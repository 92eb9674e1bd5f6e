"""Causal ALiBi attention: the slopes, and the two kernels that apply them.

ALiBi adds ``slope_h * (j - i)`` to the score of query i on key j (≤ 0 for the causal
past), so the model needs no position embedding and a KV cache needs no positions
beyond the offset of the first new query.

Kernels: SDPA with an additive float mask works everywhere (and is the only one with a
backward on CPU); FlexAttention with an ALiBi ``score_mod`` never materialises the
H×S×S bias and is the fast path on CUDA. ``auto`` picks Flex on CUDA without a cache.
"""

from __future__ import annotations

import math
from functools import lru_cache

import torch
import torch.nn.functional as F


def alibi_slopes(n_heads: int) -> torch.Tensor:
    """Geometric slopes 2^(-8(i+1)/n); for n not a power of two, the slopes of the
    nearest lower power of two, then every other slope of the next power of two."""

    def power_of_two(n: int) -> list[float]:
        start = 2.0 ** (-8.0 / n)
        return [start ** (i + 1) for i in range(n)]

    if n_heads & (n_heads - 1) == 0:
        return torch.tensor(power_of_two(n_heads))
    lower = 2 ** math.floor(math.log2(n_heads))
    extra = power_of_two(2 * lower)[0::2][: n_heads - lower]
    return torch.tensor(power_of_two(lower) + extra)


def alibi_causal_bias(slopes: torch.Tensor, q_len: int, k_len: int, *, dtype: torch.dtype,
                      device: torch.device, key_padding: torch.Tensor | None = None,
                      start: torch.Tensor | None = None) -> torch.Tensor:
    """Additive [1, H, q_len, k_len] mask; queries are the last q_len of k_len positions,
    or with ``start`` (a 0-d tensor: a static cache's length) positions start..start+q_len-1,
    every key after them masked like any future key.

    With ``key_padding`` [B, k_len] (True where a row has no token) the mask is
    [B, H, q_len, k_len] and no query attends to a padding key. Those keys get the
    most negative finite value rather than -inf: a padding query, whose every key is
    padding, then averages them (a finite result nobody reads) instead of yielding NaN,
    while a real query gives them weight exp(min - max) = 0 exactly. Distances then
    count a row's tokens, not positions, so padding between two tokens (the holes a
    batched speculative round leaves) does not lengthen theirs; left padding lies
    between none, and there the two counts agree.
    """
    if start is None:
        q_pos = torch.arange(k_len - q_len, k_len, device=device)[:, None]
    else:
        q_pos = (start.to(device) + torch.arange(q_len, device=device))[:, None]
    k_pos = torch.arange(k_len, device=device)[None, :]
    slopes = slopes.to(device=device, dtype=torch.float32)
    if key_padding is None:
        distance = (k_pos - q_pos).to(torch.float32)  # ≤ 0 in the causal past
        bias = (slopes[:, None, None] * distance).unsqueeze(0)
    else:
        key_padding = key_padding.to(device)
        tokens = (~key_padding).to(torch.float32).cumsum(-1)  # [B, k_len]: tokens up to each position
        at_queries = tokens[:, -q_len:] if start is None else tokens[:, q_pos[:, 0]]
        distance = tokens[:, None, :] - at_queries[:, :, None]  # [B, q_len, k_len]
        bias = slopes[None, :, None, None] * distance[:, None]
    bias = bias.masked_fill(k_pos > q_pos, float("-inf")).to(dtype)
    if key_padding is not None:
        pad = key_padding[:, None, None, :] & (k_pos <= q_pos)
        bias = bias.masked_fill(pad, torch.finfo(dtype).min)
    return bias


def sdpa_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   bias: torch.Tensor) -> torch.Tensor:
    """q [B, H, T, D], k/v [B, H, K, D], bias [1, H, T, K] -> [B, H, T, D]."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias)


@lru_cache(maxsize=None)
def _flex_kernel(compiled: bool):
    from torch.nn.attention.flex_attention import flex_attention

    # Eager Flex materialises the scores; compiled it is a fused kernel. Compile only
    # where Triton exists (CUDA); the CPU path is for tests of the forward. Shapes are
    # left to Dynamo's automatic dynamism: layer dropout changes the kept batch size
    # every step, and a static compile would recompile per size until the cache limit.
    return torch.compile(flex_attention) if compiled else flex_attention


@lru_cache(maxsize=16)
def causal_block_mask(q_len: int, k_len: int, device: str):
    from torch.nn.attention.flex_attention import create_block_mask

    offset = k_len - q_len

    def causal(b, h, q_idx, kv_idx):
        return q_idx + offset >= kv_idx

    return create_block_mask(causal, B=None, H=None, Q_LEN=q_len, KV_LEN=k_len, device=device)


def flex_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   slopes: torch.Tensor) -> torch.Tensor:
    """FlexAttention with the ALiBi bias computed inside the kernel."""
    q_len, k_len = q.shape[-2], k.shape[-2]
    if q.shape[0] == 0:
        # No kept rows: nothing to attend. ``q * 0`` (empty) rather than new zeros keeps
        # the qkv projection in the autograd graph, so DDP/FSDP see its (zero) gradient.
        return q * 0
    # A tensor, not a Python int: a compiled kernel takes it as an input instead of
    # recompiling for every cache length.
    offset = torch.tensor(k_len - q_len, device=q.device)
    slopes = slopes.to(device=q.device, dtype=torch.float32)

    def alibi(score, b, h, q_idx, kv_idx):
        return score + slopes[h] * (kv_idx - q_idx - offset)

    # One new query (a decoding step) sees every cached key: nothing to mask.
    block_mask = None if q_len == 1 else causal_block_mask(q_len, k_len, str(q.device))
    return _flex_kernel(q.is_cuda)(q, k, v, score_mod=alibi, block_mask=block_mask)


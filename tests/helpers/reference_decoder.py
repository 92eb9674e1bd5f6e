"""The decoder's training forward written out the slow, obvious way, for the tests.

One hand-written reference that the module, layer-dropout and loss tests compare with,
so that none of them checks the model against the model's own methods: every block
runs on the whole batch and each branch is multiplied by its keep mask, its scale
(r_train) and CompleteP's residual multiplier, the definition

    H[b] <- H[b] + m_L⁻¹ · r_train · M[b] · f(H[b])

with ALiBi attention as explicit scores (slopes by the standard rule, recomputed
here), squared-ReLU FFN, pre-LN, and µP's logit multiplier 1/m_d on the unembedding.
Only the weights come from the Decoder (by parameter name); the multipliers come from
its config, so a forward that forgets one of them disagrees with this one.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch


def alibi_slopes(n_heads: int) -> list[float]:
    """2^(-8(i+1)/m) for the m = largest power of two <= n heads, then the odd-numbered
    slopes of 2m for the remaining heads."""
    m = 1 << (n_heads.bit_length() - 1)
    return [2.0 ** (-8.0 * (i + 1) / m) for i in range(m)] + \
        [2.0 ** (-4.0 * (2 * j + 1) / m) for j in range(n_heads - m)]


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + eps) * weight + bias


def linear(x: torch.Tensor, params: dict[str, torch.Tensor], name: str) -> torch.Tensor:
    out = x @ params[f"{name}.weight"].T
    return out + params[f"{name}.bias"] if f"{name}.bias" in params else out


def attention(x: torch.Tensor, params: dict[str, torch.Tensor], prefix: str, n_heads: int,
              head_dim: int) -> torch.Tensor:
    batch, seq, _ = x.shape
    qkv = linear(x, params, f"{prefix}.qkv").view(batch, seq, 3, n_heads, head_dim)
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]  # [B, S, H, D]
    scores = torch.einsum("bihd,bjhd->bhij", q, k) / math.sqrt(head_dim)
    positions = torch.arange(seq)
    distance = (positions[None, :] - positions[:, None]).to(x.dtype)  # j - i, <= 0 in the past
    slopes = torch.tensor(alibi_slopes(n_heads), dtype=x.dtype)
    scores = scores + slopes[:, None, None] * distance
    scores = scores.masked_fill(positions[None, :] > positions[:, None], float("-inf"))
    out = torch.einsum("bhij,bjhd->bihd", torch.softmax(scores, dim=-1), v)
    return linear(out.reshape(batch, seq, n_heads * head_dim), params, f"{prefix}.proj")


def feed_forward(x: torch.Tensor, params: dict[str, torch.Tensor], prefix: str) -> torch.Tensor:
    return linear(torch.clamp(linear(x, params, f"{prefix}.up"), min=0) ** 2, params, f"{prefix}.down")


def reference_hidden(decoder: torch.nn.Module, tokens: torch.Tensor,
                     attn_masks: Sequence[torch.Tensor] | None = None,
                     ffn_masks: Sequence[torch.Tensor] | None = None,
                     scales: Sequence[float] | None = None, layers: int | None = None) -> torch.Tensor:
    """The residual stream before the final norm (after the first ``layers`` blocks, all by
    default: an early exit); no masks = every block on every row."""
    cfg = decoder.config
    params = dict(decoder.named_parameters())
    n = cfg.n_layers if layers is None else layers
    ones = torch.ones(tokens.shape[0], dtype=torch.bool)
    attn_masks = attn_masks if attn_masks is not None else [ones] * n
    ffn_masks = ffn_masks if ffn_masks is not None else attn_masks
    scales = scales if scales is not None else [1.0] * n
    h = params["embed.weight"][tokens]
    for layer in range(n):
        prefix = f"blocks.{layer}"
        attn_mult = (cfg.residual_multiplier * scales[layer] * attn_masks[layer].to(h.dtype)).view(-1, 1, 1)
        x = layer_norm(h, params[f"{prefix}.attn_norm.weight"], params[f"{prefix}.attn_norm.bias"], cfg.norm_eps)
        h = h + attn_mult * attention(x, params, f"{prefix}.attn", cfg.n_heads, cfg.head_dim)
        ffn_mult = (cfg.residual_multiplier * scales[layer] * ffn_masks[layer].to(h.dtype)).view(-1, 1, 1)
        x = layer_norm(h, params[f"{prefix}.ffn_norm.weight"], params[f"{prefix}.ffn_norm.bias"], cfg.norm_eps)
        h = h + ffn_mult * feed_forward(x, params, f"{prefix}.ffn")
    return h


def reference_logits(decoder: torch.nn.Module, tokens: torch.Tensor,
                     attn_masks: Sequence[torch.Tensor] | None = None,
                     ffn_masks: Sequence[torch.Tensor] | None = None,
                     scales: Sequence[float] | None = None) -> torch.Tensor:
    """Logits [B, S, V] of the definition (final LayerNorm, unembedding, × 1/m_d)."""
    cfg = decoder.config
    params = dict(decoder.named_parameters())
    h = reference_hidden(decoder, tokens, attn_masks, ffn_masks, scales)
    h = layer_norm(h, params["norm.weight"], params["norm.bias"], cfg.norm_eps)
    return (h @ params["head.weight"].T) * cfg.logit_multiplier


def reference_loss(decoder: torch.nn.Module, tokens: torch.Tensor, targets: torch.Tensor,
                   **masks: Sequence[torch.Tensor] | Sequence[float] | None) -> torch.Tensor:
    """Mean next-token cross-entropy of the reference logits, as log-softmax by hand."""
    logits = reference_logits(decoder, tokens, **masks).float()
    log_probs = logits - torch.logsumexp(logits, dim=-1, keepdim=True)
    return -log_probs.gather(-1, targets.unsqueeze(-1)).mean()

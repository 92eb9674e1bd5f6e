"""The Llama family: RMSNorm, RoPE, SwiGLU and grouped-query attention, no biases.

The same Decoder interface as Celerity (framework/model/decoder.py): the residual logic of a
block (layer dropout's gather -> branch -> scatter-add, per-row early exit), the
block loop, exits, skip sets and the KV cache are the base classes'; this module only
supplies the parts. Parameter names are Celerity's too (``attn.qkv`` holds the
query, key and value projections one after the other, ``ffn.up`` the gate and up
projections), so FSDP2 wrapping and FLOP accounting need no family of their own, and
the parametrization groups are the Block's (linear weights hidden, norms and biases
not); framework/families/llama/hf.py maps the names to Hugging Face's.

What a block's attention needs besides its input, one ``RotaryInputs`` per forward:
the angles of every query's position and, where plain causality does not say it
all (left padding, queries after a cache), the additive mask.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from framework.model.attention import alibi_causal_bias
from framework.config import ModelConfig
from framework.families.llama.rotary import rotary_cos_sin, rotary_frequencies, rotate
from framework.model.kv_cache import KVCache
from framework.model.decoder import Block, Decoder


@dataclass
class RotaryInputs:
    """cos/sin [B or 1, T, D] of the queries' positions; ``mask`` [B or 1, 1, T, K]
    additive, or None for plain causal attention over T = K keys (or one query)."""

    cos: torch.Tensor
    sin: torch.Tensor
    mask: torch.Tensor | None

    def rows(self, rows: torch.Tensor) -> torch.Tensor | None:
        """The mask of the batch rows ``rows`` (a shared mask serves every row)."""
        if self.mask is None or self.mask.shape[0] == 1:
            return self.mask
        return self.mask[rows]


class RMSNorm(nn.Module):
    """x / rms(x) · weight, computed in float32 whatever the input dtype (as Llama does)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def reset_parameters(self) -> None:
        nn.init.ones_(self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        normed = F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps)
        return self.weight * normed.to(x.dtype)


class GroupedQueryAttention(nn.Module):
    """Causal attention with RoPE; ``n_kv_heads`` key/value heads shared by groups of
    query heads (SDPA's enable_gqa: no copies of K/V). A family built on these blocks
    changes ``qkv_bias`` or ``heads`` (Qwen2's q/k/v biases, Qwen3's per-head q/k norms)."""

    qkv_bias = False

    def __init__(self, cfg: ModelConfig, layer_index: int) -> None:
        super().__init__()
        self.layer_index = layer_index
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        self.qkv = nn.Linear(cfg.d_model, cfg.qkv_dim, bias=self.qkv_bias)
        self.proj = nn.Linear(cfg.attn_dim, cfg.d_model, bias=False)

    def heads(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q [B, T, H, D] and k, v [B, T, H_kv, D] of x [B, T, d], before RoPE."""
        batch, seq, _ = x.shape
        kv_width = self.n_kv_heads * self.head_dim
        q, k, v = self.qkv(x).split([self.n_heads * self.head_dim, kv_width, kv_width], dim=-1)
        return (q.view(batch, seq, self.n_heads, self.head_dim), k.view(batch, seq, self.n_kv_heads, self.head_dim),
                v.view(batch, seq, self.n_kv_heads, self.head_dim))

    def forward(self, x: torch.Tensor, inputs: RotaryInputs, cache: KVCache | None,
                rows: torch.Tensor | None = None) -> torch.Tensor:
        """Every row's K/V goes to the cache; with ``rows`` only those rows' queries run."""
        seq = x.shape[1]
        q, k, v = (t.transpose(1, 2) for t in self.heads(x))
        q, k = rotate(q, inputs.cos, inputs.sin), rotate(k, inputs.cos, inputs.sin)
        if cache is not None:
            k, v = cache.update(self.layer_index, k, v)
        mask = inputs.mask
        if rows is not None:
            q, k, v, mask = q[rows], k[rows], v[rows], inputs.rows(rows)
        if mask is not None and mask.dtype != q.dtype:
            mask = mask.to(q.dtype)  # under autocast q is low precision
        out = causal_attention(q, k, v, mask)
        return self.proj(out.transpose(1, 2).reshape(q.shape[0], seq, self.n_heads * self.head_dim))


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """q [B, H, T, D], k/v [B, H_kv, K, D]; without a mask, causal over T = K keys (or one query)."""
    # A branch, not an expression: under torch.compile's dynamic shapes T > 1 is symbolic, which SDPA's
    # flag cannot take; the branch makes it a guard (one graph for T = 1, one for T > 1).
    causal = False
    if mask is None and q.shape[2] > 1:
        causal = True
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal,
                                          enable_gqa=k.shape[1] != q.shape[1])


class SwiGLU(nn.Module):
    """down(silu(gate(x)) · up(x)); ``up`` holds the gate rows first, then the up rows."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.up = nn.Linear(cfg.d_model, 2 * cfg.ffn_dim, bias=False)
        self.down = nn.Linear(cfg.ffn_dim, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.up(x).chunk(2, dim=-1)
        return self.down(F.silu(gate) * up)


class LlamaBlock(Block):
    """Pre-norm block of the Llama family (Block's residual logic, Llama's parts)."""

    ffn_matrices = 3  # SwiGLU: gate, up and down

    @staticmethod
    def new_norm(cfg: ModelConfig) -> nn.Module:
        return RMSNorm(cfg.d_model, cfg.norm_eps)

    @staticmethod
    def new_attention(cfg: ModelConfig, layer_index: int) -> nn.Module:
        return GroupedQueryAttention(cfg, layer_index)

    @staticmethod
    def new_ffn(cfg: ModelConfig) -> nn.Module:
        return SwiGLU(cfg)

    @staticmethod
    def activation_bytes_per_token(cfg: ModelConfig, mixed: bool) -> int:
        """Bytes one block saves for backward per token, e = 2 under bf16-mixed, 4 under
        32-true, kv = n_kv_heads·head_dim:

            2 RMSNorms  2·(8d + 4 + e·d)   the fp32 input, the normalised x (the weight
                                           multiplies outside the fused kernel and needs
                                           it), 1/rms, and the projection's input
            attention   e·(3a + 3kv) + 4h  the q/k/v projection's output, the rotated q
                                           and k, the output (merging the heads is a view
                                           of it), the fp32 log-sum-exp of each of h heads
            SwiGLU      4e·f               the gate/up output, silu(gate), their product
        """
        e = 2 if mixed else 4
        d, a, f = cfg.d_model, cfg.attn_dim, cfg.ffn_dim
        kv = cfg.n_kv_heads * cfg.head_dim
        return 2 * (8 * d + 4 + e * d) + e * (3 * a + 3 * kv) + 4 * cfg.n_heads + 4 * e * f


class LlamaDecoder(Decoder):
    """A Llama-family decoder; ``tie_embeddings`` shares the embedding with the head.
    The families built on its blocks subclass it with their own ``family`` and ``block_class``."""

    family = "llama"
    block_class = LlamaBlock

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__(cfg)
        self.tie_weights()

    def tie_weights(self) -> None:
        if self.config.tie_embeddings and self.head.weight is not self.embed.weight:
            self.head.weight = self.embed.weight

    def reset_buffers(self) -> None:
        """The RoPE frequencies (not in checkpoints) and the tie, which moving a
        decoder off the meta device with ``to_empty`` undoes."""
        self.register_buffer("rope_frequencies", rotary_frequencies(self.config, self.embed.weight.device),
                             persistent=False)
        self.tie_weights()

    def attention_bias(self, q_len: int, cache: KVCache | None = None,
                       padding: torch.Tensor | None = None) -> RotaryInputs:
        """What every block's attention needs for ``q_len`` new queries: their RoPE
        angles and the mask. Under left padding a row's positions count its tokens
        only (its first token is at position 0, as Hugging Face numbers them)."""
        device = self.embed.weight.device
        # start: None, the queries are the last q_len of k_len keys; a tensor, a static cache's length
        start, k_len = cache.span(q_len) if cache is not None else (None, q_len)
        queries = (torch.arange(k_len - q_len, k_len, device=device) if start is None
                   else start + torch.arange(q_len, device=device))
        key_padding = cache.key_padding(k_len) if cache is not None else padding
        if key_padding is None:
            positions = queries[None]
            mask = None
            # queries after cached keys (SDPA's is_causal would align them wrong), or keys after the queries
            if start is not None or q_len not in (1, k_len):
                mask = self._causal_mask(q_len, k_len, None, start)
        else:
            key_padding = key_padding.to(device)
            positions = ((~key_padding).long().cumsum(-1) - 1).clamp(min=0)[:, queries]
            mask = self._causal_mask(q_len, k_len, key_padding, start)
        cos, sin = rotary_cos_sin(self.rope_frequencies, positions)
        return RotaryInputs(cos, sin, mask)

    def _causal_mask(self, q_len: int, k_len: int, key_padding: torch.Tensor | None,
                     start: torch.Tensor | None = None) -> torch.Tensor:
        # ALiBi's mask with slope 0 is the plain causal mask, with the same padding rules.
        weight = self.embed.weight
        return alibi_causal_bias(torch.zeros(1), q_len, k_len, dtype=weight.dtype, device=weight.device,
                                 key_padding=key_padding, start=start)

    def new_cache(self, batch_size: int, max_len: int | None = None, *, extra_layers: int = 0,
                  static: bool = False) -> KVCache:
        cfg, weight = self.config, self.embed.weight
        return self.cache_class(static)(cfg.n_layers + extra_layers, batch_size, cfg.n_kv_heads, cfg.head_dim,
                                        max_len or cfg.max_seq_len, dtype=weight.dtype, device=weight.device)

    def num_parameters(self, *, non_embedding: bool = False) -> int:
        total = sum(p.numel() for p in self.parameters())  # a tied matrix counts once
        if non_embedding:
            total -= self.embed.weight.numel() + (0 if self.config.tie_embeddings else self.head.weight.numel())
        return total


__all__ = ["LlamaDecoder", "LlamaBlock", "GroupedQueryAttention", "SwiGLU", "RMSNorm", "RotaryInputs"]

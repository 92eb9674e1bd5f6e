"""Qwen3's blocks: Llama's, with an RMSNorm over each query and key head (``attn.q_norm``,
``attn.k_norm``: one weight of head_dim each, shared by the heads), applied before RoPE.

FLOPs are Llama's (a norm is O(d) work per token, not counted). Activation memory adds
what the two norms save for backward (``activation_bytes_per_token``).
"""

from __future__ import annotations

import torch
import torch.nn as nn

from framework.config import ModelConfig
from framework.families.llama.blocks import GroupedQueryAttention, LlamaBlock, LlamaDecoder, RMSNorm


class Qwen3Attention(GroupedQueryAttention):
    def __init__(self, cfg: ModelConfig, layer_index: int) -> None:
        super().__init__(cfg, layer_index)
        self.q_norm = RMSNorm(cfg.head_dim, cfg.norm_eps)
        self.k_norm = RMSNorm(cfg.head_dim, cfg.norm_eps)

    def heads(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        q, k, v = super().heads(x)
        return self.q_norm(q), self.k_norm(k), v


class Qwen3Block(LlamaBlock):
    @staticmethod
    def new_attention(cfg: ModelConfig, layer_index: int) -> nn.Module:
        return Qwen3Attention(cfg, layer_index)

    @staticmethod
    def activation_bytes_per_token(cfg: ModelConfig, mixed: bool) -> int:
        """Llama's block, plus the q and k norms over n = a + kv channels in h + h_kv
        heads (e = 2 under bf16-mixed, 4 under 32-true):

            2 RMSNorms  4n·[mixed] + e·n + 4·(h + h_kv)   the fp32 copy of q and k (under
                                        32-true the input is the projection's output, already
                                        counted), the normalised q and k the weight multiplies,
                                        and 1/rms per head
        """
        e = 2 if mixed else 4
        n = cfg.attn_dim + cfg.n_kv_heads * cfg.head_dim
        fp32_copy = 4 * n if mixed else 0
        return LlamaBlock.activation_bytes_per_token(cfg, mixed) + fp32_copy + e * n + 4 * (cfg.n_heads + cfg.n_kv_heads)


class Qwen3Decoder(LlamaDecoder):
    family = "qwen3"
    block_class = Qwen3Block


__all__ = ["Qwen3Decoder", "Qwen3Block", "Qwen3Attention"]

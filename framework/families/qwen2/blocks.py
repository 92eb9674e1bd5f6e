"""Qwen2's blocks: Llama's, with a bias on the fused q/k/v projection (``attn.qkv.bias``,
in the parametrization's norms-and-biases group).

FLOPs and activation memory are Llama's: a bias adds O(d) work per token (not counted,
as in framework/flops.py) and saves no tensor for backward.
"""

from __future__ import annotations

import torch.nn as nn

from framework.config import ModelConfig
from framework.families.llama.blocks import GroupedQueryAttention, LlamaBlock, LlamaDecoder


class Qwen2Attention(GroupedQueryAttention):
    qkv_bias = True


class Qwen2Block(LlamaBlock):
    @staticmethod
    def new_attention(cfg: ModelConfig, layer_index: int) -> nn.Module:
        return Qwen2Attention(cfg, layer_index)


class Qwen2Decoder(LlamaDecoder):
    family = "qwen2"
    block_class = Qwen2Block


__all__ = ["Qwen2Decoder", "Qwen2Block", "Qwen2Attention"]

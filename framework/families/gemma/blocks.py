"""Gemma's blocks: Llama's attention with Gemma's RMSNorm and GeGLU, and a decoder whose
token embedding is multiplied by √d_model.

The norm keeps w with 1 + w as its scale (Hugging Face's layout, so the weights map by
name) and, unlike Llama's, multiplies in float32 before casting back. FLOPs are Llama's
(three d×f matrices; the GELU, the 1 + w and the embedding's scale are O(d) per token, not
counted), and so are the bytes a block saves for backward: the norm keeps its float32
input, the normalised x and 1/rms as Llama's does, and GeGLU's tanh GELU needs only its
input, as SiLU does.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from framework.config import ModelConfig
from framework.families.llama.blocks import LlamaBlock, LlamaDecoder, SwiGLU


class GemmaRMSNorm(nn.Module):
    """x / rms(x) · (1 + weight) in float32, cast back to x's dtype; weight 0 is the identity."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(dim))

    def reset_parameters(self) -> None:
        nn.init.zeros_(self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        normed = F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps)
        return (normed * (1.0 + self.weight.float())).to(x.dtype)


class GeGLU(SwiGLU):
    """down(gelu_tanh(gate(x)) · up(x)); ``up`` holds the gate rows first, then the up rows."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.up(x).chunk(2, dim=-1)
        return self.down(F.gelu(gate, approximate="tanh") * up)


class ScaledEmbedding(nn.Embedding):
    """The embedding times √d, the factor rounded to the weight's dtype (as Gemma does)."""

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        out = super().forward(tokens)
        return out * torch.tensor(self.embedding_dim ** 0.5, dtype=out.dtype, device=out.device)


class GemmaBlock(LlamaBlock):
    @staticmethod
    def new_norm(cfg: ModelConfig) -> nn.Module:
        return GemmaRMSNorm(cfg.d_model, cfg.norm_eps)

    @staticmethod
    def new_ffn(cfg: ModelConfig) -> nn.Module:
        return GeGLU(cfg)


class GemmaDecoder(LlamaDecoder):
    family = "gemma"
    block_class = GemmaBlock

    @staticmethod
    def new_embedding(cfg: ModelConfig) -> nn.Embedding:
        return ScaledEmbedding(cfg.vocab_size, cfg.d_model)


__all__ = ["GemmaDecoder", "GemmaBlock", "GemmaRMSNorm", "GeGLU", "ScaledEmbedding"]

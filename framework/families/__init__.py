"""Model families behind the one Decoder interface: ``model.decoder.family``.

    celerity   framework/model/decoder.py: pre-LN, ALiBi, squared-ReLU FFN (the paper's; the default)
    llama      framework/families/llama.py: RMSNorm, RoPE, SwiGLU, grouped-query attention

Build decoders (and single blocks, e.g. exit adapters) through ``build_decoder`` /
``new_block``: the family comes from the config.
"""

from __future__ import annotations

import torch.nn as nn

from framework.config import ModelConfig
from framework.families.llama import LlamaDecoder
from framework.model.decoder import Decoder

FAMILIES: dict[str, type[Decoder]] = {"celerity": Decoder, "llama": LlamaDecoder}


def build_decoder(cfg: ModelConfig) -> Decoder:
    """The decoder of ``cfg.family``."""
    return FAMILIES[cfg.family](cfg)


def new_block(cfg: ModelConfig, layer_index: int) -> nn.Module:
    """One block of ``cfg.family`` (``layer_index`` numbers its KV-cache slot)."""
    return FAMILIES[cfg.family].block_class(cfg, layer_index)


__all__ = ["FAMILIES", "build_decoder", "new_block"]

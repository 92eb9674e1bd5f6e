"""The tiny decoder the tests build (seeded, so every call gives the same weights).

The defaults are the eval tests' model: non-unit multipliers so the checks cover the
parametrization's forward factors, and weights larger than the default initialisation
so greedy choices are not ties and exits differ from each other. ``double``: float64
for tests that compare two computations exactly.
"""

from __future__ import annotations

import torch

from framework.config import ModelConfig
from framework.model.decoder import Decoder


def tiny_decoder(seed: int = 0, n_layers: int = 3, max_seq_len: int = 64, *, vocab_size: int = 300, d_model: int = 32,
                 n_heads: int = 4, std: float = 0.2, multipliers: bool = True, double: bool = False) -> Decoder:
    torch.manual_seed(seed)
    factors = {"logit_multiplier": 0.5, "residual_multiplier": 0.8} if multipliers else {}
    cfg = ModelConfig(vocab_size=vocab_size, d_model=d_model, n_layers=n_layers, n_heads=n_heads,
                      max_seq_len=max_seq_len, attention="sdpa", **factors)
    decoder = Decoder(cfg)
    decoder.init_weights(std=std)
    return decoder.double().eval() if double else decoder.eval()

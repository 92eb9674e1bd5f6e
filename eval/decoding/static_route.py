"""The route of every token through the same blocks: full, early exit, skip set.

``exit_layer`` K runs blocks 0..K-1, minus ``skip_layers`` (passed through by the
residual); with ``adapter`` (the Balcony exit adapter at K) its block reads the exit
state before the shared final norm + head and keeps its K/V in an extra cache slot.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from framework.model.kv_cache import KVCache
from framework.model.decoder import Block, Decoder, StepOutput


class StaticRoute:
    """Every token runs the same blocks (see the module docstring)."""

    def __init__(self, model: Decoder, *, exit_layer: int | None = None, skip_layers: Sequence[int] = (),
                 adapter: Block | None = None) -> None:
        self.layers = model.active_layers(exit_layer, skip_layers)  # validates both
        if adapter is not None and (exit_layer is None or skip_layers):
            raise ValueError("an exit adapter reads one exit: give exit_layer (and no skip_layers)")
        self.exits = {} if adapter is None else {exit_layer: adapter}
        self.extra_layers = 0 if adapter is None else adapter.attn.layer_index - len(model.blocks) + 1
        self.blocks_per_token = len(self.layers) + (adapter is not None)

    def prefill(self, model: Decoder, tokens: torch.Tensor, cache: KVCache, padding: torch.Tensor) -> None:
        model.step(tokens, cache, layers=self.layers, padding=padding, exits=self.exits)

    def step(self, model: Decoder, tokens: torch.Tensor, cache: KVCache,
             forward: Callable[..., StepOutput] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits [B, V] of the next token after ``tokens`` [B, 1], and blocks run per row
        (``forward``: the step to call instead of ``model.step``)."""
        out = (forward or model.step)(tokens, cache, layers=self.layers, exits=self.exits)
        read = out.reads[next(iter(self.exits))] if self.exits else out.hidden
        return model.logits(read[:, -1]), self.blocks(tokens.shape[0])

    def blocks(self, rows: int) -> torch.Tensor:
        """[rows]: the blocks each row runs for a token (the same for every row)."""
        return torch.full((rows,), self.blocks_per_token, dtype=torch.long)

    def select_rows(self, rows: torch.Tensor) -> None:
        pass


__all__ = ["StaticRoute"]

"""Per-token confident early exit (`layerdrop generate --mode dynamic`).

Each generated token runs the blocks up to a candidate exit K, reads its prediction
there with the exit head (the shared final norm + unembedding, or the trained Balcony
adapter at K), and leaves at the first candidate where the head is confident enough;
otherwise it runs the whole model. This follows CALM (Schuster et al., 2022):

- confidence: the "softmax response", the gap between the two largest probabilities
  of the exit head's distribution, in [0, 1]; a token exits when it is >= the
  threshold. Threshold 0: every token exits at the first candidate; threshold 1:
  none exits early, the output is the full model's.
- the skipped layers' K/V: a token that exits at K still writes K/V at every later
  layer, computed from the state it exited with (each skipped layer's own norm and
  K/V projection applied to that state): CALM's "state propagation". Later tokens
  then find a K/V entry at every layer, at the price of the K/V projections of the
  skipped layers (about 3/20 of a block's weights here: 3d² of q/k/v, d² out, 16d² FFN,
  and only k/v are used) instead of whole blocks. Computing the skipped layers for real
  at the next step would keep the K/V exact but run every layer at every step (for the
  previous token), which takes back the time exiting saved; state propagation is
  what the CALM authors found to cost little quality.
- candidates: every exit of the given adapters, or ``exits`` (default: about a
  quarter, half and three quarters of the depth). Each candidate a token passes costs
  one evaluation of the head, which with a large vocabulary weighs more than a block:
  few candidates, not all L - 1.

``dynamic_forward`` computes the same decisions teacher-forced over whole sequences in
one pass (the reference the incremental decoder is tested against, and how the
validation loss of the tokens "as decoded" is measured).
"""

from __future__ import annotations

import re
from typing import Sequence

import torch

from eval.decoding.compiled_step import CompiledStep
from framework.model.kv_cache import KVCache
from framework.model.decoder import Decoder


def default_candidates(num_layers: int) -> list[int]:
    """About a quarter, half and three quarters of the depth (as the adapters' exits)."""
    return sorted({min(num_layers - 1, max(1, round(num_layers * f))) for f in (0.25, 0.5, 0.75)})


def exits_rule(num_layers: int) -> str:
    """The one rule of candidate exits, as every message states it."""
    return (f"candidate exits must be in 1..{num_layers - 1} (exit K runs blocks 0..K-1; the model has "
            f"{num_layers} layers)")


def parse_candidates(spec: str, num_layers: int) -> list[int]:
    """``--exits`` "2,4", "2-4" or both (comma separated) -> sorted candidate exits."""
    exits: set[int] = set()
    for part in (p.strip() for p in str(spec).split(",")):
        match = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if not match:
            raise ValueError(f"--exits {spec!r} is invalid: {exits_rule(num_layers)}; write them like 1,2 or 1-2")
        exits.update(range(int(match.group(1)), int(match.group(2) or match.group(1)) + 1))
    if not exits or not all(1 <= e <= num_layers - 1 for e in exits):
        raise ValueError(f"--exits {spec!r} is invalid: {exits_rule(num_layers)}")
    return sorted(exits)


def check_threshold(threshold: float) -> float:
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0.0 <= threshold <= 1.0:
        raise ValueError(f"threshold={threshold!r} is invalid: must be in [0, 1] (0: every token exits at the "
                         "first candidate; 1: none exits early)")
    return float(threshold)


def confidence(logits: torch.Tensor) -> torch.Tensor:
    """CALM's softmax response: top-1 minus top-2 probability, [R] in [0, 1]."""
    top = torch.softmax(logits.float(), dim=-1).topk(2, dim=-1).values
    return top[..., 0] - top[..., 1]


class DynamicExit:
    """The decoding route of per-token confident early exit (see the module docstring)."""

    def __init__(self, model: Decoder, *, threshold: float = 0.9, exits: Sequence[int] | None = None,
                 adapters=None) -> None:
        num_layers = len(model.blocks)
        self.threshold = check_threshold(threshold)
        if adapters is not None:
            chosen = list(adapters.exits) if exits is None else sorted(set(exits))
            missing = [e for e in chosen if e not in adapters.exits]
            if missing:
                raise ValueError(f"exits={chosen} is invalid: the adapters have exits {adapters.exits} only")
        else:
            chosen = default_candidates(num_layers) if exits is None else sorted(set(exits))
        bad = [e for e in chosen if isinstance(e, bool) or not isinstance(e, int) or not 1 <= e <= num_layers - 1]
        if bad or not chosen:
            raise ValueError(f"exits={list(chosen)} is invalid: {exits_rule(num_layers)}")
        self.candidates, self.adapters, self.num_layers = chosen, adapters, num_layers
        self.extra_layers = len(adapters.exits) if adapters is not None else 0

    def select_rows(self, rows: torch.Tensor) -> None:
        pass  # no state between steps: everything lives in the cache

    def adapter(self, exit_layer: int):
        """The adapter block exit ``exit_layer``'s head reads through (None: the plain exit)."""
        return None if self.adapters is None else self.adapters.blocks[str(exit_layer)]

    def exits(self) -> dict:
        """{candidate exit: its adapter or None}, as ``Decoder.step(exits=...)`` takes them."""
        return {e: self.adapter(e) for e in self.candidates}

    def leaves(self, logits: torch.Tensor) -> torch.Tensor:
        """[R] bool: the rows whose exit logits [R, V] are confident enough to stop there."""
        if self.threshold >= 1.0:
            return torch.zeros(logits.shape[0], dtype=torch.bool, device=logits.device)
        return confidence(logits) >= self.threshold

    def prefill(self, model: Decoder, tokens: torch.Tensor, cache: KVCache, padding: torch.Tensor) -> None:
        """The prompt runs every layer (its K/V is exact), and every adapter on its exit."""
        model.step(tokens, cache, padding=padding, exits=self._adapter_exits())

    def step(self, model: Decoder, tokens: torch.Tensor, cache: KVCache) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits [B, V] of the next token after ``tokens`` [B, 1], and the blocks each
        row ran (its exit K, plus the adapter blocks it went through)."""
        rows = tokens.shape[0]
        if self.threshold >= 1.0:  # no token may leave early: the full model, no head before the last
            out = model.step(tokens, cache)
            return model.logits(out.hidden[:, -1]), torch.full((rows,), self.num_layers, dtype=torch.long)
        if isinstance(model.__dict__.get("step"), CompiledStep):
            return self._segmented_step(model, tokens, cache)
        logits: list[torch.Tensor | None] = [None] * rows
        blocks = torch.full((rows,), self.blocks_run(), dtype=torch.long)

        def leave(exit_layer: int, read: torch.Tensor, running: torch.Tensor) -> torch.Tensor:
            still = running[:, -1].nonzero().flatten()
            head = model.logits(read[still, -1])
            leaving = self.leaves(head)
            self._settle(logits, blocks, still[leaving], head[leaving], self.blocks_run(exit_layer))
            mask = torch.zeros_like(running)
            mask[still[leaving], -1] = True
            return mask

        out = model.step(tokens, cache, exits=self.exits(), leave=leave)
        still = torch.arange(rows, device=tokens.device) if out.running is None else out.running[:, -1].nonzero()[:, 0]
        self._settle(logits, blocks, still, model.logits(out.hidden[still, -1]), self.blocks_run())
        return torch.stack(logits), blocks  # type: ignore[arg-type]

    def _segmented_step(self, model: Decoder, tokens: torch.Tensor, cache: KVCache
                        ) -> tuple[torch.Tensor, torch.Tensor]:
        """``step`` as steps of a few blocks each, from one candidate exit to the next, for
        compiled decoding: the same decisions, made in Python between the steps, and the
        same cache (the rows still running computed, the others' K/V propagated from the
        state they left with)."""
        count = tokens.shape[0]
        logits: list[torch.Tensor | None] = [None] * count
        blocks = torch.full((count,), self.blocks_run(), dtype=torch.long)
        everyone = torch.arange(count, device=tokens.device)
        h, done, rows = tokens, 0, None  # rows: the indices still running (None: every row)
        for exit_layer in self.candidates:
            out = model.step(h, cache, layers=range(done, exit_layer), exits={exit_layer: self.adapter(exit_layer)},
                             rows=rows, advance=False)
            h, done = out.hidden, exit_layer
            still = everyone if rows is None else rows
            if not still.numel():
                continue  # every row has left: the later blocks only write their K/V
            head = model.logits(out.reads[exit_layer][still, -1])
            leaving = self.leaves(head)
            if bool(leaving.any()):
                self._settle(logits, blocks, still[leaving], head[leaving], self.blocks_run(exit_layer))
                rows = still[~leaving]
        out = model.step(h, cache, layers=range(done, self.num_layers), rows=rows)
        still = everyone if rows is None else rows
        self._settle(logits, blocks, still, model.logits(out.hidden[still, -1]), self.blocks_run())
        return torch.stack(logits), blocks  # type: ignore[arg-type]

    def blocks_run(self, exit_layer: int | None = None) -> int:
        """The blocks a token runs when it leaves at ``exit_layer`` (None: it runs the whole
        model), the adapter blocks of the candidates it passed included."""
        if exit_layer is None:
            return self.num_layers + (len(self.candidates) if self.adapters else 0)
        return exit_layer + (self.candidates.index(exit_layer) + 1 if self.adapters else 0)

    @staticmethod
    def _settle(logits: list, blocks: torch.Tensor, rows: torch.Tensor, row_logits: torch.Tensor,
                cost: int) -> None:
        """Rows ``rows`` are done: their logits and the blocks they ran."""
        for row, value in zip(rows.tolist(), row_logits):
            logits[row] = value
            blocks[row] = cost

    def _adapter_exits(self) -> dict:
        return {e: self.adapter(e) for e in self.adapters.exits} if self.adapters is not None else {}


@torch.inference_mode()
def dynamic_forward(model: Decoder, route: DynamicExit, tokens: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """Teacher-forced: for every position of ``tokens`` [B, S], the hidden state its
    exit head reads (pre-norm, [B, S, d]) and its exit K [B, S], decided exactly as
    incremental decoding with ``route`` decides them (same confidence, same propagated
    K/V), but for all positions in one pass (without a prefill: every position decides)."""
    out = torch.zeros(*tokens.shape, model.config.d_model, dtype=model.embed.weight.dtype, device=tokens.device)
    exits = torch.full(tokens.shape, route.num_layers, dtype=torch.long, device=tokens.device)

    def leave(exit_layer: int, read: torch.Tensor, running: torch.Tensor) -> torch.Tensor:
        picked = read[running]
        leaving = torch.zeros_like(running)
        leaving[running] = route.leaves(model.logits(picked))
        out[leaving] = read[leaving]
        exits[leaving] = exit_layer
        return leaving

    # an exited position keeps its state; its K/V for later positions come from it
    result = model.step(tokens, exits=route.exits(), leave=leave)
    running = result.running if result.running is not None else torch.ones_like(exits, dtype=torch.bool)
    out[running] = result.hidden[running]
    return out, exits


__all__ = ["DynamicExit", "dynamic_forward", "confidence", "check_threshold", "default_candidates", "exits_rule",
           "parse_candidates"]

"""Layer dropout, the paper's mechanism: whole blocks skipped per sequence.

    H[b] <- H[b] + r_train * M[b] * f(H[b]),   M[b] ~ Bernoulli(1 - p),  r_train = 1/ρ

The saving is real only if f runs on the kept sequences alone, so a residual branch
gathers the kept rows, runs on them and scatter-adds the scaled result back
(``residual_update``). The branch is called even when no row is kept: FSDP2 and
ZeRO-3 all-gather inside the block's hooks and DDP expects every parameter in the
graph, so a rank that skipped the call would hang or fail the job.

Masks derive from (seed, rank, step, micro-batch, layer) alone, so they differ on
every device and a resumed run draws the same ones without saved RNG state. How a
mask is drawn is a mask mode (``MASK_MODES``: per sequence, per micro-batch, or a
count); the config's ``mask`` field takes its names from that registry.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Sequence

import torch

if TYPE_CHECKING:
    from framework.config import LayerDropoutConfig


@dataclass
class LayerDrop:
    """What one layer keeps: row indices (None = every row) and the branch scale."""

    attn_rows: torch.Tensor | None
    ffn_rows: torch.Tensor | None
    scale: float = 1.0


@dataclass
class DropPlan:
    """What one training forward drops, for every layer of the model."""

    layers: list[LayerDrop]
    batch_size: int

    def __len__(self) -> int:
        return len(self.layers)

    def kept_counts(self) -> list[tuple[int, int]]:
        """(attention rows, FFN rows) run per layer: what the FLOP accounting counts."""

        def count(rows: torch.Tensor | None) -> int:
            return self.batch_size if rows is None else int(rows.numel())

        return [(count(layer.attn_rows), count(layer.ffn_rows)) for layer in self.layers]

    @classmethod
    def from_masks(cls, attn_masks: Sequence[torch.Tensor], scales: Sequence[float],
                   ffn_masks: Sequence[torch.Tensor] | None = None) -> "DropPlan":
        """A plan from explicit boolean keep masks [B] per layer (tests, custom policies)."""
        ffn_masks = attn_masks if ffn_masks is None else ffn_masks
        if not (len(attn_masks) == len(ffn_masks) == len(scales)):
            raise ValueError(f"masks and scales need one entry per layer: got {len(attn_masks)}, "
                             f"{len(ffn_masks)} and {len(scales)}")
        batch_size = int(attn_masks[0].numel()) if len(attn_masks) else 0
        for index, (a, f, s) in enumerate(zip(attn_masks, ffn_masks, scales)):
            if a.dim() != 1 or f.dim() != 1 or a.numel() != batch_size or f.numel() != batch_size:
                raise ValueError(f"masks of layer {index} are invalid: need 1-D masks of the batch size "
                                 f"{batch_size}, got {tuple(a.shape)} and {tuple(f.shape)}")
            if not (math.isfinite(s) and s > 0):
                raise ValueError(f"scales[{index}]={s!r} is invalid: must be a positive number")
        layers = [LayerDrop(_rows(a), _rows(f), float(s)) for a, f, s in zip(attn_masks, ffn_masks, scales)]
        return cls(layers, batch_size=batch_size)


@dataclass(frozen=True)
class StepKey:
    """Identifies one micro-batch forward on one device; the layer completes the seed."""

    seed: int
    rank: int
    step: int
    micro_batch: int = 0

    def generator(self, layer: int) -> torch.Generator:
        digest = hashlib.blake2b(
            repr((self.seed, self.rank, self.step, self.micro_batch, layer)).encode(), digest_size=8
        ).digest()
        return torch.Generator().manual_seed(int.from_bytes(digest, "little") & (2**63 - 1))


def _rows(mask: torch.Tensor) -> torch.Tensor:
    return torch.nonzero(mask.to(torch.bool).flatten(), as_tuple=False).flatten()


# ------------------------------------------------------------------ mask modes
# Each draws a boolean keep mask [B] whose rows are kept with probability 1 - p each,
# so E[kept rows] = B·(1 - p) and one scale, r_train = 1/ρ with ρ = 1 - p, keeps every
# mode's branch unbiased: E[scale · M[b]] = 1.


def keep_sequences(p: float, batch_size: int, gen: torch.Generator) -> torch.Tensor:
    """One Bernoulli(1 - p) draw per sequence (the paper's default)."""
    return torch.rand(batch_size, generator=gen) >= p


def keep_batch(p: float, batch_size: int, gen: torch.Generator) -> torch.Tensor:
    """One draw for the whole micro-batch: every row kept, or none."""
    return torch.full((batch_size,), bool(torch.rand(1, generator=gen).item() >= p))


def keep_count(p: float, batch_size: int, gen: torch.Generator) -> torch.Tensor:
    """A kept count k drawn by stochastic rounding of B·(1 - p) between its two nearest
    integers (so E[k] = B·(1 - p) exactly), then k rows chosen uniformly.

    What it trades: a layer runs on one of only two row counts for a given rate, so a
    compiled graph or CUDA graph sees at most two shapes per layer (sequence masks can
    produce any of B + 1), at the price of rows that are not independent (exactly k of
    B are kept) and a count that still varies between two values.
    """
    expected = batch_size * (1.0 - p)
    kept = math.floor(expected)
    if torch.rand(1, generator=gen).item() < expected - kept:
        kept += 1
    keep = torch.zeros(batch_size, dtype=torch.bool)
    keep[torch.randperm(batch_size, generator=gen)[:kept]] = True
    return keep


# name -> (p, B, generator) -> keep mask [B]
MASK_MODES: dict[str, Callable[[float, int, torch.Generator], torch.Tensor]] = {
    "sequence": keep_sequences,
    "batch": keep_batch,
    "count": keep_count,
}


def plan(cfg: LayerDropoutConfig, rates: Sequence[float], batch_size: int,
         generator: torch.Generator | StepKey) -> DropPlan:
    """Draw the masks of one forward at per-layer drop rates ``rates``.

    ``generator`` is either one generator drawn from layer after layer, or a
    ``StepKey`` that seeds each layer from (seed, rank, step, micro-batch, layer).
    """
    draw = MASK_MODES[cfg.mask]
    layers = []
    for index, p in enumerate(rates):
        gen = generator.generator(index) if isinstance(generator, StepKey) else generator
        if p == 0.0:
            layers.append(LayerDrop(None, None, 1.0))
            continue
        attn_rows = _rows(draw(p, batch_size, gen))
        ffn_rows = attn_rows if cfg.structure == "layer" else _rows(draw(p, batch_size, gen))
        scale = 1.0 / (1.0 - p) if cfg.r_train == "inverse_density" else 1.0
        layers.append(LayerDrop(attn_rows, ffn_rows, scale))
    return DropPlan(layers, batch_size)


def residual_update(h: torch.Tensor, branch: Callable[[torch.Tensor], torch.Tensor],
                    rows: torch.Tensor | None, scale: float) -> torch.Tensor:
    """h + scale·branch(h) on the kept rows only: gather -> branch -> scatter-add."""
    if rows is None:
        return torch.add(h, branch(h), alpha=scale)  # one fused pass, not a mul then an add
    rows = rows.to(h.device, non_blocking=True)
    out = branch(h.index_select(0, rows))  # runs on zero rows too: see the module docstring
    # A multiply, not index_add's alpha: a compiled block gets the scale as a tensor
    # (framework/strategies/parallelize.compile_block), where a Python-number alpha would be a graph
    # constant and every new r_train (each step under DTS) a recompilation. Under autocast the
    # branch is bf16 while the stream stays float32, and index_add does not promote.
    return h.index_add(0, rows, (out * scale).to(h.dtype))

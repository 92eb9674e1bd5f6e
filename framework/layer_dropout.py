"""Layer dropout, the paper's mechanism: whole blocks skipped per sequence.

    H[b] <- H[b] + r_train * M[b] * f(H[b]),   M[b] ~ Bernoulli(1 - p),  r_train = 1/ρ

The saving is real only if f runs on the kept sequences alone, so a residual branch
gathers the kept rows, runs on them and scatter-adds the scaled result back
(``residual_update``). The branch is called even when no row is kept: FSDP2 and
ZeRO-3 all-gather inside the block's hooks and DDP expects every parameter in the
graph, so a rank that skipped the call would hang or fail the job.

Masks derive from (seed, rank, step, micro-batch, layer) alone, so they differ on
every device and a resumed run draws the same ones without saved RNG state.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

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


def _draw_keep(mode: str, p: float, batch_size: int, gen: torch.Generator) -> tuple[torch.Tensor, float]:
    """A boolean keep mask [B] and the density it realises in expectation (for 1/ρ)."""
    if mode == "sequence":
        return torch.rand(batch_size, generator=gen) >= p, 1.0 - p
    if mode == "batch":
        keep = bool(torch.rand(1, generator=gen).item() >= p)
        return torch.full((batch_size,), keep), 1.0 - p
    # "count": a fixed number of kept rows gives static shapes (torch.compile, CUDA
    # graphs); scaling by B/k keeps the branch unbiased for that fixed k.
    kept = max(1, round(batch_size * (1.0 - p)))
    keep = torch.zeros(batch_size, dtype=torch.bool)
    keep[torch.randperm(batch_size, generator=gen)[:kept]] = True
    return keep, kept / batch_size


def plan(cfg: LayerDropoutConfig, rates: Sequence[float], batch_size: int,
         generator: torch.Generator | StepKey) -> DropPlan:
    """Draw the masks of one forward at per-layer drop rates ``rates``.

    ``generator`` is either one generator drawn from layer after layer, or a
    ``StepKey`` that seeds each layer from (seed, rank, step, micro-batch, layer).
    """
    layers = []
    for index, p in enumerate(rates):
        if not 0.0 <= p < 1.0:
            raise ValueError(f"rates[{index}]={p!r} is invalid: must be in [0, 1)")
        gen = generator.generator(index) if isinstance(generator, StepKey) else generator
        if p == 0.0:
            layers.append(LayerDrop(None, None, 1.0))
            continue
        attn_keep, density = _draw_keep(cfg.mask, p, batch_size, gen)
        ffn_keep = attn_keep if cfg.structure == "layer" else _draw_keep(cfg.mask, p, batch_size, gen)[0]
        scale = 1.0 / density if cfg.r_train == "inverse_density" else 1.0
        attn_rows = _rows(attn_keep)
        ffn_rows = attn_rows if cfg.structure == "layer" else _rows(ffn_keep)
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
    # (framework/strategies.compile_block), where a Python-number alpha would be a graph
    # constant and every new r_train (each step under DTS) a recompilation.
    return h.index_add(0, rows, out * scale)

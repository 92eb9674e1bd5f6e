"""Choosing the next token: greedy, or sampling with temperature, top-k and top-p.

Every sequence of a batch draws from its own ``torch.Generator``, seeded by default
from (seed, the prompt's tokens): a prompt's sampled continuation is the same whether
it is decoded alone, in any batch, or anywhere in a prompts file, and the same run
after run (the same prompt twice gives the same text twice). Seeding from (seed, the
sequence's position in the input) instead (``SEED_BY`` "position") gives repeated
prompts different texts, and then a prompt's text depends on where it is. A draw is
the inverse CDF of one uniform number per sequence, which keeps the per-sequence
streams apart without one sampling call per row.

The filtered distribution (top-k, then top-p over what is left, renormalised) is also
what self-speculative decoding's rejection step compares draft and target with, so a
sampled speculative run keeps the filtered target distribution.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Sequence

import torch

# Keeps the seeds of neighbouring positions apart (any odd constant would do).
_SEED_STRIDE = 1_000_003
SEED_BY = ("prompt", "position")


@dataclass(frozen=True)
class Sampling:
    """temperature 0 is greedy (argmax); top_k / top_p apply only when sampling."""

    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None

    def __post_init__(self) -> None:
        if not (isinstance(self.temperature, (int, float)) and self.temperature >= 0):
            raise ValueError(f"temperature={self.temperature!r} is invalid: must be >= 0 (0 = greedy)")
        if self.top_k is not None and (isinstance(self.top_k, bool) or not isinstance(self.top_k, int)
                                       or self.top_k < 1):
            raise ValueError(f"top_k={self.top_k!r} is invalid: must be an integer >= 1")
        if self.top_p is not None and not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p={self.top_p!r} is invalid: must be in (0, 1]")
        if self.greedy and (self.top_k is not None or self.top_p is not None):
            raise ValueError("top_k/top_p filter a sampled distribution: give a temperature > 0 "
                             "(temperature 0 is greedy)")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def probabilities(self, logits: torch.Tensor) -> torch.Tensor:
        """The (filtered, renormalised) float32 distribution [R, V] sampling draws from."""
        scores = logits.float() / self.temperature
        if self.top_k is not None and self.top_k < scores.shape[-1]:
            kth = scores.topk(self.top_k, dim=-1).values[..., -1:]
            scores = scores.masked_fill(scores < kth, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        if self.top_p is not None and self.top_p < 1.0:
            sorted_probs, order = probs.sort(dim=-1, descending=True)
            before = sorted_probs.cumsum(-1) - sorted_probs  # mass of the tokens ranked above
            drop = torch.zeros_like(probs, dtype=torch.bool).scatter(-1, order, before >= self.top_p)
            probs = probs.masked_fill(drop, 0.0)
            probs = probs / probs.sum(-1, keepdim=True)
        return probs

    def choose(self, logits: torch.Tensor, generators: list[torch.Generator | None]
               ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Next tokens [R] for logits [R, V], and the distribution drawn from (None if greedy)."""
        if self.greedy:
            return logits.argmax(-1), None
        probs = self.probabilities(logits)
        return draw(probs, uniforms(generators, probs.device)), probs


def sequence_seed(seed: int, key: int | Sequence[int]) -> int:
    """The seed of one sequence's stream: from its position (an int ``key``) or from its
    prompt (a token list: a hash of the seed and the tokens, the same in every process)."""
    if isinstance(key, int):
        return seed * _SEED_STRIDE + key
    digest = hashlib.blake2b(json.dumps([int(seed), [int(t) for t in key]]).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1  # a non-negative 63-bit seed


def sequence_keys(prompts: Sequence[Sequence[int]], numbers: Sequence[int] | None, seed_by: str) -> list:
    """What each sequence's stream is seeded from (see the module docstring)."""
    if seed_by not in SEED_BY:
        raise ValueError(f"seed_by={seed_by!r} is invalid: allowed: {', '.join(SEED_BY)}")
    if seed_by == "prompt":
        return [list(p) for p in prompts]
    return list(numbers if numbers is not None else range(len(prompts)))


def row_generators(seed: int, keys: Sequence[int | Sequence[int]]) -> list[torch.Generator]:
    """One generator per sequence, seeded from ``sequence_seed(seed, key)``."""
    return [torch.Generator().manual_seed(sequence_seed(seed, key)) for key in keys]


def uniforms(generators: list[torch.Generator | None], device: torch.device | str = "cpu") -> torch.Tensor:
    """One U[0, 1) number per generator, as a [R] float64 tensor on ``device`` (0.5, drawn
    from nothing, for a row whose draw is not used: its stream stays untouched)."""
    values = [float(torch.rand((), generator=g, dtype=torch.float64)) if g is not None else 0.5 for g in generators]
    return torch.tensor(values, dtype=torch.float64, device=device)


def draw(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF draws [R] from the rows of ``probs`` [R, V] (need not sum to 1)."""
    cdf = probs.double().cumsum(-1)
    target = (u * cdf[:, -1]).unsqueeze(-1)
    index = torch.searchsorted(cdf, target, right=True).squeeze(-1)
    # Never past the last token that has mass (u * total can round up to the total).
    last = probs.shape[-1] - 1 - (probs.flip(-1) > 0).int().argmax(-1)
    return torch.minimum(index, last)


__all__ = ["SEED_BY", "Sampling", "sequence_seed", "sequence_keys", "row_generators", "uniforms", "draw"]

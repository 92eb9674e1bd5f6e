"""Next-token cross-entropy computed a chunk of tokens at a time.

With the Llama-3 vocabulary (128,256 entries) the logits of one micro-batch are the
biggest tensor of the step: 8 × 2048 tokens × 128k × 4 bytes = 8.4 GB in float32, and
autograd would keep them (and their softmax) for backward. Here the final norm and
unembedding run on ``chunk_tokens`` rows at a time under activation checkpointing, so
at most one chunk's logits exist at once, in forward and in backward (which recomputes
that chunk's logits: one extra head forward, 2·d·V FLOPs per token).

A micro-batch that fits in one chunk takes the plain path (no recomputation).
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

IGNORE_INDEX = -100


def chunked_cross_entropy(hidden: torch.Tensor, targets: torch.Tensor,
                          logits_fn: Callable[[torch.Tensor], torch.Tensor], *,
                          chunk_tokens: int = 4096, ignore_index: int = IGNORE_INDEX) -> torch.Tensor:
    """Mean cross-entropy of ``logits_fn(hidden)`` against ``targets``.

    ``hidden`` is [..., d] (the residual stream before the final norm), ``targets``
    the matching [...] token ids; positions equal to ``ignore_index`` are left out of
    the mean. Equal to ``F.cross_entropy(logits_fn(hidden).flatten(0, -2).float(),
    targets.flatten())`` up to float rounding, with the same gradients.
    """
    if isinstance(chunk_tokens, bool) or not isinstance(chunk_tokens, int) or chunk_tokens < 1:
        raise ValueError(f"chunk_tokens={chunk_tokens!r} is invalid: must be a positive integer")
    if hidden.shape[:-1] != targets.shape:
        raise ValueError(f"hidden {tuple(hidden.shape)} and targets {tuple(targets.shape)} are invalid: "
                         "hidden must be targets' shape plus a feature dimension")
    rows = hidden.reshape(-1, hidden.shape[-1])
    labels = targets.reshape(-1)
    count = (labels != ignore_index).sum().clamp(min=1)
    if rows.shape[0] <= chunk_tokens:
        return _summed_loss(rows, labels, logits_fn, ignore_index) / count
    total = rows.new_zeros((), dtype=torch.float32)
    for start in range(0, rows.shape[0], chunk_tokens):
        piece = slice(start, start + chunk_tokens)
        total = total + checkpoint(_summed_loss, rows[piece], labels[piece], logits_fn, ignore_index,
                                   use_reentrant=False)
    return total / count


def _summed_loss(rows: torch.Tensor, labels: torch.Tensor,
                 logits_fn: Callable[[torch.Tensor], torch.Tensor], ignore_index: int) -> torch.Tensor:
    # float32 softmax whatever the compute dtype: bf16 log-sum-exp over 128k entries
    # loses the digits that separate a good model from a slightly better one.
    logits = logits_fn(rows).float()
    return F.cross_entropy(logits, labels, ignore_index=ignore_index, reduction="sum")


__all__ = ["chunked_cross_entropy", "IGNORE_INDEX"]

"""Reductions over the logits of many tokens, computed a chunk of tokens at a time.

With the Llama-3 vocabulary (128,256 entries) the logits of one micro-batch are the
biggest tensor of the step: 8 × 2048 tokens × 128k × 4 bytes = 8.4 GB in float32, and
autograd would keep them (and their softmax) for backward. ``chunked_sum`` is the one
place that cuts a reduction into chunks of rows: the final norm and unembedding run on
``chunk_tokens`` rows at a time, only each chunk's reduced value survives, and in
training each chunk runs under activation checkpointing, so at most one chunk's logits
exist at once, in forward and in backward (which recomputes that chunk's logits: one
extra head forward, 2·d·V FLOPs per token). Everything that reduces logits (the
training loss, the early-exit losses, the adapters' KL) goes through it.

A micro-batch that fits in one chunk takes the plain path (no recomputation).
"""

from __future__ import annotations

from typing import Callable, Iterable, Sequence

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from framework.config import PositiveInt, check

IGNORE_INDEX = -100
# Rows of logits per chunk for inference. On a GPU, big chunks keep the matmuls
# efficient: 2^26 float32 logits (256 MB), 523 tokens at the Llama-3 vocabulary. On a
# CPU the cross-entropy is memory-bound, so a chunk's logits should stay in cache (2^21
# entries, 8 MB), but with at least d_model rows so the head's weight matrix, read once
# per chunk, is amortised.
GPU_LOGIT_BUDGET = 2**26
CPU_LOGIT_BUDGET = 2**21


def chunked_sum(fn: Callable[..., torch.Tensor], *tensors: torch.Tensor, chunk_tokens: int,
                recompute: bool = False) -> torch.Tensor:
    """Σ over chunks of ``fn(*chunk)``, each chunk the same ``chunk_tokens`` rows of every
    tensor (all [N, ...] with the same N); ``recompute`` checkpoints each chunk."""
    check("chunk_tokens", chunk_tokens, PositiveInt)
    rows = tensors[0].shape[0]
    if rows <= chunk_tokens:
        return fn(*tensors)
    total = None
    for start in range(0, rows, chunk_tokens):
        piece = [t[start:start + chunk_tokens] for t in tensors]
        value = checkpoint(fn, *piece, use_reentrant=False) if recompute else fn(*piece)
        total = value if total is None else total + value
    return total


def chunked_cross_entropy(hidden: torch.Tensor, targets: torch.Tensor,
                          logits_fn: Callable[[torch.Tensor], torch.Tensor], *,
                          chunk_tokens: int = 4096, ignore_index: int = IGNORE_INDEX) -> torch.Tensor:
    """Mean cross-entropy of ``logits_fn(hidden)`` against ``targets`` (training).

    ``hidden`` is [..., d] (the residual stream before the final norm), ``targets``
    the matching [...] token ids; positions equal to ``ignore_index`` are left out of
    the mean. Equal to ``F.cross_entropy(logits_fn(hidden).flatten(0, -2).float(),
    targets.flatten())`` up to float rounding, with the same gradients.
    """
    rows, labels = _flat(hidden, targets)
    count = (labels != ignore_index).sum().clamp(min=1)
    total = chunked_sum(lambda h, y: _summed_cross_entropy(logits_fn(h), y, ignore_index), rows, labels,
                        chunk_tokens=chunk_tokens, recompute=True)
    return total / count


def exit_cross_entropies(states: Sequence[torch.Tensor], targets: torch.Tensor,
                         logits_fn: Callable[[torch.Tensor], torch.Tensor], exits: Iterable[int], *,
                         chunk_tokens: int = 4096) -> dict[int, torch.Tensor]:
    """{K: mean cross-entropy at exit K} (training): ``states[K-1]`` is the stream after
    block K-1, ``logits_fn`` the shared final norm and head. Every row reaches every
    exit: under layer dropout a block a row dropped passed its input on, which is the
    state the exit sees."""
    return {exit: chunked_cross_entropy(states[exit - 1], targets, logits_fn, chunk_tokens=chunk_tokens)
            for exit in exits}


def summed_cross_entropy(hidden: torch.Tensor, targets: torch.Tensor,
                         logits_fn: Callable[[torch.Tensor], torch.Tensor], *, chunk_tokens: int,
                         ignore_index: int = IGNORE_INDEX) -> torch.Tensor:
    """Σ cross-entropy (a float64 accumulator, no autograd) of ``logits_fn(hidden)``
    [..., d] against ``targets`` [...]: the evaluation sum that many batches add up."""
    rows, labels = _flat(hidden, targets)
    return chunked_sum(lambda h, y: _summed_cross_entropy(logits_fn(h), y, ignore_index).double(),
                       rows, labels.to(rows.device), chunk_tokens=chunk_tokens)


class LogitWatch:
    """Wraps a ``logits_fn`` to keep the largest logit it produced (detached, on its
    device: no host synchronisation until someone reads ``max``). Training health
    (framework/training/health.py) watches the loss's logits on its logging steps; a
    chunk recomputed in backward yields the same maximum again."""

    def __init__(self, logits_fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
        self.logits_fn, self.max = logits_fn, None

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.logits_fn(hidden)
        top = logits.detach().amax()
        self.max = top if self.max is None else torch.maximum(self.max, top)
        return logits


def inference_chunk_tokens(vocab_size: int, d_model: int, on_gpu: bool) -> int:
    """Rows per logits chunk for evaluation (see the budgets above)."""
    if on_gpu:
        return max(1, GPU_LOGIT_BUDGET // vocab_size)
    return max(d_model, CPU_LOGIT_BUDGET // vocab_size)


def counted_tokens(targets: torch.Tensor, ignore_index: int = IGNORE_INDEX) -> int:
    return int((targets != ignore_index).sum())


def _flat(hidden: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if hidden.shape[:-1] != targets.shape:
        raise ValueError(f"hidden {tuple(hidden.shape)} and targets {tuple(targets.shape)} are invalid: "
                         "hidden must be targets' shape plus a feature dimension")
    return hidden.reshape(-1, hidden.shape[-1]), targets.reshape(-1)


def _summed_cross_entropy(logits: torch.Tensor, labels: torch.Tensor, ignore_index: int) -> torch.Tensor:
    # float32 softmax whatever the compute dtype: bf16 log-sum-exp over 128k entries
    # loses the digits that separate a good model from a slightly better one.
    return F.cross_entropy(logits.float(), labels, ignore_index=ignore_index, reduction="sum")


__all__ = ["chunked_sum", "LogitWatch", "chunked_cross_entropy", "exit_cross_entropies", "summed_cross_entropy",
           "inference_chunk_tokens",
           "counted_tokens", "IGNORE_INDEX"]

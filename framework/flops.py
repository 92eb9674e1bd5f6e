"""FLOP accounting that knows about layer dropout.

Counted: matrix multiplies, at 2 FLOPs per multiply-add.

    per token, forward     attention: 2·d·3a (qkv) + 2·a·d (proj) + 2·a·k (QKᵀ) + 2·a·k (AV)
                           FFN:       2·d·f (up) + 2·f·d (down)
                           head:      2·d·V (unembedding; the embedding is a lookup: 0)

with a = heads·head_dim, f = ffn_mult·d, and k the keys a query attends to. Training
is 3× forward (the backward computes input and weight gradients, 2× forward each).
Not counted: LayerNorms, biases, softmax, squared ReLU, the residual adds — O(d) per
token against O(d²), well under 1% at the paper's sizes.

Attention keys: ``causal=True`` (default) counts the (S+1)/2 keys a query attends to
on average under the causal mask — the useful work, what a mask-aware kernel such as
FlexAttention with a block mask executes. ``causal=False`` counts all S keys, which is
what SDPA with a dense additive mask executes (and what torch's FlopCounterMode
reports). Under "layer" structure (attention and FFN keep the same rows) layer dropout
saves the same *fraction* under either convention, since every term of a block scales
with the rows it runs on; under "sublayer" structure the realised fraction weighs the
two sublayers differently, though its expectation is 1 - mean(p) either way.

A dropped layer runs on its kept rows only (framework/layer_dropout.py), so executed
FLOPs are counted per layer and sublayer from the rows each one ran on.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from framework.config import ModelConfig


@dataclass(frozen=True)
class Flops:
    """FLOPs split by where they are spent: the blocks' attention and FFN sublayers, and
    the unembedding head (0 for a single block)."""

    attention: float
    ffn: float
    head: float = 0.0

    @property
    def blocks(self) -> float:
        """Non-embedding FLOPs: what layer dropout can save."""
        return self.attention + self.ffn

    @property
    def total(self) -> float:
        return self.blocks + self.head


def _passes(training: bool) -> int:
    return 3 if training else 1


def _check_count(name: str, value: Any, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name}={value!r} is invalid: must be an integer >= {minimum}")
    return value


def attended_keys(seq_len: int, causal: bool = True) -> float:
    """Keys per query averaged over a sequence: (S+1)/2 under the causal mask, else S."""
    seq_len = _check_count("seq_len", seq_len)
    return (seq_len + 1) / 2 if causal else float(seq_len)


def block_flops_per_token(model_cfg: ModelConfig, seq_len: int, *, causal: bool = True,
                          training: bool = True) -> Flops:
    """FLOPs one block spends per token, attention and FFN separately."""
    d, a, f = model_cfg.d_model, model_cfg.attn_dim, model_cfg.ffn_dim
    keys = attended_keys(seq_len, causal)
    attention = 2 * d * 3 * a + 2 * a * d + 2 * 2 * a * keys
    ffn = 2 * 2 * d * f
    passes = _passes(training)
    return Flops(attention=passes * attention, ffn=passes * ffn)


def head_flops_per_token(model_cfg: ModelConfig, *, training: bool = True) -> float:
    """The unembedding's FLOPs per token (every token, dropout or not)."""
    return _passes(training) * 2 * model_cfg.d_model * model_cfg.vocab_size


def dense_step_flops(model_cfg: ModelConfig, batch_size: int, seq_len: int, *,
                     causal: bool = True, training: bool = True) -> Flops:
    """FLOPs of a step (micro-batch) in which every block runs on every sequence."""
    batch_size = _check_count("batch_size", batch_size)
    kept = [(batch_size, batch_size)] * model_cfg.n_layers
    return executed_step_flops(model_cfg, kept, seq_len, batch_size=batch_size,
                               causal=causal, training=training)


def executed_step_flops(model_cfg: ModelConfig, plan_or_kept_counts: Any, seq_len: int, *,
                        batch_size: int | None = None, causal: bool = True,
                        training: bool = True) -> Flops:
    """FLOPs a step actually runs: each layer's sublayers on their kept rows only.

    ``plan_or_kept_counts`` is a DropPlan (anything with ``kept_counts()``) or a list of
    (attention, FFN) per layer, each an int, a 1-D tensor of kept row indices, or a
    boolean keep mask. ``batch_size`` (taken from a plan's ``batch_size`` when not
    given) bounds the counts and sizes the head, which runs on every row.
    """
    counts = kept_counts(plan_or_kept_counts)
    if batch_size is None:
        batch_size = getattr(plan_or_kept_counts, "batch_size", None)
    if batch_size is None:
        raise ValueError("batch_size=None is invalid: pass the micro-batch size with plain kept "
                         "counts (the head runs on every row)")
    batch_size = _check_count("batch_size", batch_size)
    _check_kept(counts, model_cfg.n_layers, batch_size)
    per_token = block_flops_per_token(model_cfg, seq_len, causal=causal, training=training)
    attention_rows = sum(a for a, _ in counts)
    ffn_rows = sum(f for _, f in counts)
    return Flops(attention=attention_rows * seq_len * per_token.attention,
                 ffn=ffn_rows * seq_len * per_token.ffn,
                 head=batch_size * seq_len * head_flops_per_token(model_cfg, training=training))


def _check_kept(counts: list[tuple[int, int]], n_layers: int, batch_size: int) -> None:
    if len(counts) != n_layers:
        raise ValueError(f"kept counts for {len(counts)} layers are invalid: the model has "
                         f"{n_layers} layers")
    for layer, pair in enumerate(counts):
        if not all(0 <= c <= batch_size for c in pair):
            raise ValueError(f"kept counts {pair} of layer {layer} are invalid: each must be "
                             f"in [0, batch_size={batch_size}]")


def kept_counts(plan_or_kept_counts: Any) -> list[tuple[int, int]]:
    """(attention rows, FFN rows) per layer from a plan or a list of per-layer entries."""
    if hasattr(plan_or_kept_counts, "kept_counts"):
        return [(int(a), int(f)) for a, f in plan_or_kept_counts.kept_counts()]
    counts = []
    for layer, pair in enumerate(plan_or_kept_counts):
        if len(pair) != 2:
            raise ValueError(f"kept entry of layer {layer} is invalid: expected an "
                             f"(attention, ffn) pair, got {len(pair)} items")
        counts.append((_rows_in(pair[0], layer), _rows_in(pair[1], layer)))
    return counts


def _rows_in(entry: Any, layer: int) -> int:
    if isinstance(entry, torch.Tensor):
        if entry.dtype == torch.bool:
            return int(entry.sum().item())
        if entry.dim() != 1 or entry.is_floating_point():
            raise ValueError(f"kept rows of layer {layer} are invalid: expected a 1-D integer "
                             f"index tensor or a boolean mask, got {entry.dtype} {tuple(entry.shape)}")
        return int(entry.numel())
    if isinstance(entry, bool) or not isinstance(entry, int):
        raise ValueError(f"kept rows of layer {layer}={entry!r} are invalid: expected an int "
                         "count, an index tensor or a boolean mask")
    return entry


def saved_fraction(executed: Flops, dense: Flops, *, include_head: bool = False) -> float:
    """1 - executed/dense over the blocks (non-embedding FLOPs, the paper's P̄ measure),
    or over the whole step with ``include_head``."""
    dense_total = dense.total if include_head else dense.blocks
    if not dense_total > 0:
        raise ValueError(f"dense FLOPs={dense_total!r} are invalid: must be positive")
    return 1.0 - (executed.total if include_head else executed.blocks) / dense_total


def expected_executed_fraction(rates: Sequence[float]) -> float:
    """The blocks' FLOPs a plan at per-layer ``rates`` runs in expectation: 1 - mean(p)
    (every block costs the same, and a layer runs on a fraction 1 - p of the rows)."""
    if len(rates) == 0:
        raise ValueError("rates=[] is invalid: need one rate per layer")
    for index, p in enumerate(rates):
        if not 0.0 <= p < 1.0:
            raise ValueError(f"rates[{index}]={p!r} is invalid: must be in [0, 1)")
    return 1.0 - math.fsum(rates) / len(rates)


__all__ = [
    "Flops",
    "attended_keys",
    "block_flops_per_token",
    "head_flops_per_token",
    "dense_step_flops",
    "executed_step_flops",
    "kept_counts",
    "saved_fraction",
    "expected_executed_fraction",
]

"""FLOP accounting that knows about layer dropout.

Counted: matrix multiplies, at 2 FLOPs per multiply-add.

    per token, forward     attention: 2·d·(a + 2·a_kv) (qkv) + 2·a·d (proj) + 2·a·k (QKᵀ) + 2·a·k (AV)
                           FFN:       2·d·f (up) + 2·f·d (down), and 2·d·f (gate) in SwiGLU
                           head:      2·d·V (unembedding; the embedding is a lookup: 0)

with a = heads·head_dim, a_kv = kv_heads·head_dim (= a without grouped-query
attention), f the FFN width (ffn_mult·d, or the RoPE families' ffn_hidden), and k the keys a query attends to. Training
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
FLOPs are counted per layer and sublayer from the rows each one ran on. Each exit head
of the early-exit loss (framework/early_exit_loss.py) is one more head on every token.

A block's FFN is its family's (``ffn_matrices``: 2 for Celerity's, 3 for a gated one), so
this module sits above framework/families/ in the layers (docs/layers.md), not in model/.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from framework.config import ModelConfig
from framework.families.registry import family_spec


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


def attended_keys(seq_len: int, causal: bool = True) -> float:
    """Keys per query averaged over a sequence: (S+1)/2 under the causal mask, else S."""
    return (seq_len + 1) / 2 if causal else float(seq_len)


def block_flops_per_token(model_cfg: ModelConfig, seq_len: int, *, causal: bool = True,
                          training: bool = True) -> Flops:
    """FLOPs one block spends per token, attention and FFN separately."""
    d, a, f = model_cfg.d_model, model_cfg.attn_dim, model_cfg.ffn_dim
    keys = attended_keys(seq_len, causal)
    attention = 2 * d * model_cfg.qkv_dim + 2 * a * d + 2 * 2 * a * keys
    ffn = 2 * family_spec(model_cfg.family).ffn_matrices * d * f  # the family's FFN
    passes = _passes(training)
    return Flops(attention=passes * attention, ffn=passes * ffn)


def head_flops_per_token(model_cfg: ModelConfig, *, training: bool = True) -> float:
    """The unembedding's FLOPs per token (every token, dropout or not)."""
    return _passes(training) * 2 * model_cfg.d_model * model_cfg.vocab_size


def dense_step_flops(model_cfg: ModelConfig, batch_size: int, seq_len: int, *,
                     causal: bool = True, training: bool = True, exit_heads: int = 0) -> Flops:
    """FLOPs of a step (micro-batch) in which every block runs on every sequence."""
    kept = [(batch_size, batch_size)] * model_cfg.n_layers
    return executed_step_flops(model_cfg, kept, seq_len, batch_size=batch_size,
                               causal=causal, training=training, exit_heads=exit_heads)


def executed_step_flops(model_cfg: ModelConfig, kept_counts: Sequence[tuple[int, int]], seq_len: int, *,
                        batch_size: int, causal: bool = True, training: bool = True,
                        exit_heads: int = 0) -> Flops:
    """FLOPs a step actually runs: each layer's sublayers on their kept rows only.

    ``kept_counts`` holds (attention rows, FFN rows) per layer, as
    ``DropPlan.kept_counts()`` gives them; the head runs on all ``batch_size`` rows,
    once for the final layer and once per early-exit loss head (``exit_heads``).
    """
    per_token = block_flops_per_token(model_cfg, seq_len, causal=causal, training=training)
    attention_rows = sum(a for a, _ in kept_counts)
    ffn_rows = sum(f for _, f in kept_counts)
    return Flops(attention=attention_rows * seq_len * per_token.attention,
                 ffn=ffn_rows * seq_len * per_token.ffn,
                 head=(1 + exit_heads) * batch_size * seq_len * head_flops_per_token(model_cfg, training=training))


def expected_training_flops_per_token(model_cfg: ModelConfig, seq_len: int, *, mean_dropout: float = 0.0,
                                      exit_heads: float = 0.0) -> Flops:
    """A training token's FLOPs in expectation over a run: the blocks at 1 - P̄ of their
    dense cost, the final head, and ``exit_heads`` early-exit heads on average a step."""
    per_token = block_flops_per_token(model_cfg, seq_len)
    kept = model_cfg.n_layers * (1.0 - mean_dropout)
    return Flops(attention=kept * per_token.attention, ffn=kept * per_token.ffn,
                 head=(1.0 + exit_heads) * head_flops_per_token(model_cfg))


def saved_fraction(executed: Flops, dense: Flops, *, include_head: bool = False) -> float:
    """1 - executed/dense over the blocks (non-embedding FLOPs, the paper's P̄ measure),
    or over the whole step with ``include_head``."""
    if include_head:
        return 1.0 - executed.total / dense.total
    return 1.0 - executed.blocks / dense.blocks


def expected_executed_fraction(rates: Sequence[float]) -> float:
    """The blocks' FLOPs a plan at per-layer ``rates`` runs in expectation: 1 - mean(p)
    (every block costs the same, and a layer runs on a fraction 1 - p of the rows)."""
    return 1.0 - math.fsum(rates) / len(rates)


__all__ = [
    "Flops",
    "attended_keys",
    "block_flops_per_token",
    "head_flops_per_token",
    "dense_step_flops",
    "executed_step_flops",
    "expected_training_flops_per_token",
    "saved_fraction",
    "expected_executed_fraction",
]

"""The memory model: peak bytes per device of one dense training step, by part.

N parameters, of which N_root outside the blocks (embedding, unembedding, final norm)
and N_block in each of the L blocks, all counted from the Decoder the config builds
(on the meta device: tied embeddings, grouped-query attention or another FFN count as
what they are); width d, attention width a = heads·head_dim, FFN width f, vocabulary
V, micro-batch m of S tokens:

    state        16·N / shards       fp32 weights 4 + gradients 4 + AdamW moments 8 per parameter;
                                     shards: the strategy's Footprint
                                     (framework/strategies/entry.py)
    working      2·N under bf16-mixed (autocast keeps a bf16 copy of each weight it casts until the
                 forward ends), + 4·N when the strategy buckets gradients (DDP's all-reduce copies
                 them into flat buckets), + 8·(N_root + 2·N_block) when it gathers blocks (the
                 gathered root and two gathered blocks, with their unsharded gradients)
    activations  m·S·L·A             A: the bytes one block saves for backward per token, which its
                                     family's block class counts (``activation_bytes_per_token``:
                                     Celerity's 8d + 2e·d + 5e·a + 2e·f in framework/model/decoder.py, each
                                     other family's in framework/families/<name>/blocks.py;
                                     e = 2 under bf16-mixed, 4 under 32-true). With activation
                                     checkpointing: m·S·L·4d (each block's input) plus one block's A.
    loss chunk   16·V·min(m·S, loss_chunk_tokens)      one chunk's logits, log-softmax and gradients

The dense step is the peak (layer dropout only lowers activations). What each
strategy shards is its own business (framework/strategies: ``footprint``), what a
block keeps its family's; the arithmetic is here, once. tests/recipes/test_device_memory.py
checks the activation term of every family against the tensors autograd saves.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from framework.config import ModelConfig
from framework.families.registry import build_decoder, family_spec
from framework.strategies.entry import Footprint


@dataclass(frozen=True)
class ModelSizes:
    """The decoder's parameter counts the memory model needs."""

    config: ModelConfig
    parameters: int
    root: int  # outside the blocks: embedding, unembedding, final norm

    @property
    def block(self) -> float:
        return (self.parameters - self.root) / self.config.n_layers

    @classmethod
    def of(cls, config: ModelConfig) -> "ModelSizes":
        """Counted from the config's decoder itself (its family's), built on the meta
        device (no memory)."""
        with torch.device("meta"):
            decoder = build_decoder(config)
        root = sum(p.numel() for name, p in decoder.named_parameters() if not name.startswith("blocks."))
        return cls(config, decoder.num_parameters(), root)


def device_memory(sizes: ModelSizes, footprint: Footprint, *, micro_batch: int, seq_len: int, checkpointing: bool,
                  loss_chunk_tokens: int, mixed: bool) -> dict[str, float]:
    """Peak bytes per device by part (the model of the module docstring)."""
    cfg, parameters = sizes.config, sizes.parameters
    tokens = micro_batch * seq_len
    per_layer = activation_bytes_per_token(cfg, mixed)
    saved = cfg.n_layers * 4 * cfg.d_model + per_layer if checkpointing else cfg.n_layers * per_layer
    return {
        "state": 16 * parameters / footprint.shards,
        "working": (2 * parameters if mixed else 0)
                   + (8 * (sizes.root + 2 * sizes.block) if footprint.gathers_blocks else 0)
                   + (4 * parameters if footprint.buckets_gradients else 0),
        "activations": tokens * saved,
        "loss chunk": 16 * cfg.vocab_size * min(tokens, loss_chunk_tokens),
    }


def activation_bytes_per_token(cfg: ModelConfig, mixed: bool) -> int:
    """Bytes one block of ``cfg.family`` saves for backward per token (the family counts them)."""
    return family_spec(cfg.family).activation_bytes_per_token(cfg, mixed)


__all__ = ["ModelSizes", "device_memory", "activation_bytes_per_token"]

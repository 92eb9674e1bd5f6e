"""framework/recipes/device_memory.py: the memory model against what a training step really
holds (autograd's saved tensors), its state term, and parameter counts taken from the
Decoder the config builds."""

from __future__ import annotations

import contextlib

import pytest
import torch

from framework.config import ModelConfig
from framework.recipes.device_memory import ModelSizes, device_memory
from framework.families.registry import build_decoder
from framework.model.decoder import Decoder
from framework.strategies import checkpoint_block
from framework.strategies.entry import Footprint


# One shape per family and attention form; each family counts its own block's bytes.
ACTIVATION_SHAPES = {
    "celerity": {},
    "llama": dict(family="llama", ffn_hidden=160, bias=False),
    # grouped K/V (2 heads for 4 queries), an FFN width of its own, the head tied to the embedding
    "llama-gqa": dict(family="llama", n_kv_heads=2, ffn_hidden=96, tie_embeddings=True, bias=False),
    # q/k/v biases (nothing more saved); per-head q/k norms with a head_dim of its own
    "qwen2": dict(family="qwen2", n_kv_heads=2, ffn_hidden=96, bias=False),
    "qwen3": dict(family="qwen3", n_kv_heads=2, head_dim=24, ffn_hidden=96, bias=False),
}


@pytest.mark.parametrize("shape", list(ACTIVATION_SHAPES))
@pytest.mark.parametrize("mixed", [False, True])
@pytest.mark.parametrize("checkpointing", [False, True])
def test_the_activation_model_is_what_autograd_saves(shape, mixed, checkpointing):
    """The activation term against the tensors a training forward really keeps for
    backward (measured as the difference between 8 and 4 sequences, so the weights and
    their bf16 copies cancel), within 5%; the attention kernel on CPU keeps what Flash
    and FlexAttention keep (the output and its log-sum-exp, no S×S scores)."""
    cfg = ModelConfig(vocab_size=64, d_model=64, n_layers=3, n_heads=4, max_seq_len=32, attention="sdpa",
                      **ACTIVATION_SHAPES[shape])
    torch.manual_seed(0)
    decoder = build_decoder(cfg).train()
    if checkpointing:
        for block in decoder.blocks:
            checkpoint_block(block)

    def saved_bytes(batch: int) -> int:
        storages = {}

        def pack(t):
            storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t

        tokens = torch.randint(0, 64, (batch, 32))
        autocast = torch.autocast("cpu", dtype=torch.bfloat16) if mixed else contextlib.nullcontext()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), autocast:
            decoder.hidden(tokens)
        return sum(storages.values())

    measured = saved_bytes(8) - saved_bytes(4)

    def model(batch: int, recompute: bool) -> float:
        return device_memory(ModelSizes(cfg, 1, 0), Footprint(shards=1), micro_batch=batch, seq_len=32,
                             checkpointing=recompute, loss_chunk_tokens=1, mixed=mixed)["activations"]

    if checkpointing:
        # Saved for backward: each block's input. The model adds one block's full
        # activations, which exist only while that block is recomputed in backward.
        one_block = (model(8, False) - model(4, False)) / cfg.n_layers
        assert measured == pytest.approx(model(8, True) - model(4, True) - one_block, rel=0.05)
    else:
        assert measured == pytest.approx(model(8, False) - model(4, False), rel=0.05)


def test_the_state_term_is_sixteen_bytes_per_parameter_over_the_shards():
    sizes = ModelSizes(ModelConfig.paper("271M"), 1000, 0)
    one, eight = (device_memory(sizes, Footprint(shards=s), micro_batch=1, seq_len=8, checkpointing=False,
                                loss_chunk_tokens=8, mixed=True)["state"] for s in (1, 8))
    assert (one, eight) == (16_000, 2_000)


def test_the_sizes_are_the_decoders_own_counts():
    cfg = ModelConfig(vocab_size=96, d_model=32, n_layers=3, n_heads=4, max_seq_len=16, attention="sdpa")
    decoder = Decoder(cfg)
    sizes = ModelSizes.of(cfg)
    assert sizes.parameters == sum(p.numel() for p in decoder.parameters())
    assert sizes.root == sum(p.numel() for m in (decoder.embed, decoder.norm, decoder.head) for p in m.parameters())
    assert sizes.block == sum(p.numel() for p in decoder.blocks[0].parameters())


def test_working_memory_follows_the_footprint():
    cfg = ModelConfig(vocab_size=96, d_model=32, n_layers=3, n_heads=4, max_seq_len=16, attention="sdpa")
    sizes = ModelSizes.of(cfg)

    def working(footprint: Footprint, mixed: bool) -> float:
        return device_memory(sizes, footprint, micro_batch=1, seq_len=8, checkpointing=False,
                             loss_chunk_tokens=8, mixed=mixed)["working"]

    n = sizes.parameters
    assert working(Footprint(shards=1), mixed=False) == 0
    assert working(Footprint(shards=1), mixed=True) == 2 * n  # autocast's bf16 weight copies
    assert working(Footprint(shards=1, buckets_gradients=True), mixed=False) == 4 * n
    assert working(Footprint(shards=4, gathers_blocks=True), mixed=False) == 8 * (sizes.root + 2 * sizes.block)


def test_the_sizes_of_a_llama_count_grouped_kv_swiglu_and_tied_embeddings():
    """Hand count of a Llama block (GQA's narrower K/V, three SwiGLU matrices, two
    RMSNorm weights, no biases) and root (one tied V×d matrix and the final norm)."""
    cfg = ModelConfig(family="llama", vocab_size=96, d_model=32, n_layers=3, n_heads=4, n_kv_heads=2, ffn_hidden=40,
                      tie_embeddings=True, bias=False, max_seq_len=16, attention="sdpa")
    d, a, kv, f = 32, 32, 2 * 8, 40
    sizes = ModelSizes.of(cfg)
    assert sizes.block == d * (a + 2 * kv) + a * d + 3 * d * f + 2 * d
    assert sizes.root == 96 * d + d
    assert sizes.parameters == sum(p.numel() for p in build_decoder(cfg).parameters())

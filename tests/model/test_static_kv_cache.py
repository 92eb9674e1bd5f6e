"""StaticKVCache: the same numbers as KVCache through every decoding operation, with
every shape fixed (attention over all max_len positions, the length a device tensor)."""

from __future__ import annotations

import pytest
import torch

from framework.config import ModelConfig
from framework.families.registry import build_decoder
from framework.model.kv_cache import KVCache
from framework.model.static_kv_cache import StaticKVCache

FAMILIES = {"celerity": {}, "llama": {"family": "llama", "bias": False, "ffn_hidden": 64, "n_kv_heads": 1},
            # Qwen3's per-head q/k norms and Gemma's scaled embedding sit on the same RoPE path
            "qwen3": {"family": "qwen3", "bias": False, "ffn_hidden": 64, "n_kv_heads": 1, "head_dim": 12},
            "gemma": {"family": "gemma", "bias": False, "ffn_hidden": 64, "n_kv_heads": 1, "head_dim": 12,
                      "tie_embeddings": True}}


def decoder(family: str, attention: str = "sdpa"):
    torch.manual_seed(0)
    return build_decoder(ModelConfig(vocab_size=101, d_model=48, n_layers=3, n_heads=3, max_seq_len=40,
                                     attention=attention, **FAMILIES[family])).double().eval()


def run_both(model, operations) -> None:
    """Apply ``operations(cache)`` (a generator of step outputs) to a KVCache and a
    StaticKVCache of the same model; every output and every length must agree."""
    plain, static = model.new_cache(3, 32), model.new_cache(3, 32, static=True)
    assert type(plain) is KVCache and type(static) is StaticKVCache
    with torch.no_grad():
        for expected, got in zip(operations(plain), operations(static), strict=True):
            torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10)
    assert static.length == plain.length and torch.equal(static.padding[:, :plain.length],
                                                         plain.padding[:, :plain.length])


@pytest.mark.parametrize("family", FAMILIES)
def test_every_decoding_operation_gives_what_the_growing_cache_gives(family):
    """Left padding, steps, a multi-token verification, a crop, rows keeping different
    prefixes (holes), compaction, rows leaving the batch."""
    model = decoder(family)
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, 101, (3, 6), generator=gen)
    padding = torch.tensor([[True, True, False, False, False, False], [False] * 6, [True] + [False] * 5])
    more = torch.randint(0, 101, (3, 12), generator=gen)

    def operations(cache):
        yield model.step(tokens, cache, padding=padding).hidden
        yield model.step(more[:, :1], cache).hidden
        yield model.step(more[:, 1:2], cache, layers=[0]).hidden  # a draft's step: the upper layers' K/V stale
        cache.crop(cache.length - 2)
        yield model.step(more[:, :4], cache).hidden  # verification from the pre-draft length
        cache.crop_rows([cache.length, cache.length - 3, cache.length - 1])
        yield model.step(more[:, 4:5], cache).hidden
        cache.compact()
        yield model.step(more[:, 5:7], cache).hidden
        cache.select_rows(torch.tensor([2, 0]))
        yield model.step(more[:2, 7:8], cache).hidden

    run_both(model, operations)


@pytest.mark.parametrize("family", FAMILIES)
def test_positions_past_the_length_are_never_read(family):
    """Every forward attends to all max_len positions: what lies past its queries (stale
    draft K/V, anything) is masked as the future."""
    model = decoder(family)
    tokens = torch.randint(0, 101, (3, 5))
    with torch.no_grad():
        clean, dirty = model.new_cache(3, 16, static=True), model.new_cache(3, 16, static=True)
        for store in (*dirty.keys, *dirty.values):
            store.normal_(std=1e3)
        expected = model.step(tokens, clean).hidden
        torch.testing.assert_close(model.step(tokens, dirty).hidden, expected, rtol=1e-10, atol=1e-10)
        nxt = torch.randint(0, 101, (3, 1))
        torch.testing.assert_close(model.step(nxt, dirty).hidden, model.step(nxt, clean).hidden,
                                   rtol=1e-10, atol=1e-10)


def test_a_static_cache_never_uses_flex_attention():
    """FlexAttention's ALiBi places the queries at the end of the keys: a static cache's
    keys run past them, so its forwards take the SDPA mask whatever the config says."""
    model = decoder("celerity", attention="flex")
    assert model.attention_bias(1, model.new_cache(1, 8)) is None
    bias = model.attention_bias(1, model.new_cache(1, 8, static=True))
    assert bias is not None and bias.shape[-1] == 8


def test_the_length_lives_on_the_device_and_crop_takes_it_as_a_tensor():
    cache = StaticKVCache(n_layers=1, batch_size=2, n_heads=1, head_dim=1, max_len=8)
    cache.advance(5)
    assert cache.length == 5 and cache.position.item() == 5 and cache.span(2) == (cache.position, 8)
    marker = cache.at(3)
    assert isinstance(marker, torch.Tensor) and KVCache(1, 2, 1, 1, 8).at(3) == 3
    cache.padding[:, 4] = True
    cache.crop(marker)
    assert cache.length == 3 and not cache.padding[:, 3:].any()
    with pytest.raises(ValueError, match=r"KV cache overflow: length 9 > max_len=8"):
        cache.advance(6)
    with pytest.raises(ValueError, match=r"crop length=4 is invalid: must be in \[0, 3\]"):
        cache.crop(4)
    cache.select_rows(torch.tensor([1]))
    assert cache.batch_size == 1 and all(t._dynamo_static_input_type for t in (*cache.keys, cache.position))

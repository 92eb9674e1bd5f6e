"""KV cache: decoding token by token gives the full forward's logits."""

from __future__ import annotations

import pytest
import torch

from framework.config import ModelConfig
from framework.model.kv_cache import KVCache
from framework.model.decoder import Decoder

pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")


def make_decoder(**overrides) -> Decoder:
    torch.manual_seed(0)
    cfg = ModelConfig(**{"vocab_size": 101, "d_model": 48, "n_layers": 4, "n_heads": 3,
                         "max_seq_len": 24, **overrides})
    return Decoder(cfg).eval()


def decode_in_chunks(decoder: Decoder, tokens: torch.Tensor, chunks: list[int], **kwargs) -> torch.Tensor:
    cache = decoder.new_cache(tokens.shape[0])
    logits, start = [], 0
    for size in chunks:
        logits.append(decoder(tokens[:, start:start + size], cache=cache, **kwargs))
        start += size
        assert cache.length == start
    return torch.cat(logits, dim=1)


@pytest.mark.parametrize("kwargs", [{}, {"skip_layers": (1,)}, {"skip_layers": (0, 2)}, {"exit_layer": 2},
                                    {"exit_layer": 3, "skip_layers": [1]}])
def test_token_by_token_matches_full_forward(kwargs):
    decoder = make_decoder()
    tokens = torch.randint(0, 101, (2, 10))
    with torch.no_grad():
        full = decoder(tokens, **kwargs)
        stepwise = decode_in_chunks(decoder, tokens, [1] * 10, **kwargs)
        prefill_then_steps = decode_in_chunks(decoder, tokens, [4, 1, 3, 1, 1], **kwargs)
    torch.testing.assert_close(stepwise, full, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(prefill_then_steps, full, rtol=1e-5, atol=1e-5)


def test_flex_decoding_matches_full_forward():
    decoder = make_decoder(attention="flex")
    tokens = torch.randint(0, 101, (1, 7))
    with torch.no_grad():
        full = decoder(tokens)
        stepwise = decode_in_chunks(decoder, tokens, [3, 1, 1, 1, 1])
    torch.testing.assert_close(stepwise, full, rtol=1e-5, atol=1e-5)


def test_crop_forgets_positions_and_decoding_resumes_exactly():
    decoder = make_decoder()
    tokens = torch.randint(0, 101, (1, 9))
    other = torch.randint(0, 101, (1, 3))
    with torch.no_grad():
        full = decoder(tokens)
        cache = decoder.new_cache(1)
        decoder(tokens[:, :6], cache=cache)
        decoder(other, cache=cache)  # a rejected draft: written, then cropped away
        cache.crop(6)
        assert cache.length == 6
        resumed = decoder(tokens[:, 6:], cache=cache)
    torch.testing.assert_close(resumed, full[:, 6:], rtol=1e-5, atol=1e-5)


def test_overflow_raises():
    decoder = make_decoder()
    cache = decoder.new_cache(1, max_len=5)
    with torch.no_grad():
        decoder(torch.zeros(1, 4, dtype=torch.long), cache=cache)
        with pytest.raises(ValueError, match="KV cache overflow: length 6 > max_len=5"):
            decoder(torch.zeros(1, 2, dtype=torch.long), cache=cache)
        assert cache.length == 4  # nothing was committed
        # Skipping every layer writes nothing, yet the position must still fit.
        with pytest.raises(ValueError, match="overflow"):
            decoder(torch.zeros(1, 2, dtype=torch.long), cache=cache, skip_layers=range(4))


def test_cache_unit_update_advance_crop():
    cache = KVCache(n_layers=2, batch_size=1, n_heads=2, head_dim=3, max_len=4)
    k = torch.arange(12.0).view(1, 2, 2, 3)
    keys, values = cache.update(1, k, -k)
    torch.testing.assert_close(keys, k)
    torch.testing.assert_close(values, -k)
    assert cache.length == 0  # update does not advance; the decoder does once all layers ran
    cache.advance(2)
    keys, _ = cache.update(1, k[:, :, :1] + 100, k[:, :, :1])
    assert keys.shape == (1, 2, 3, 3)
    torch.testing.assert_close(keys[:, :, :2], k)
    torch.testing.assert_close(keys[:, :, 2:], k[:, :, :1] + 100)
    assert cache.keys[0].abs().sum() == 0  # other layers untouched
    with pytest.raises(ValueError, match="crop length=3 is invalid: must be in \\[0, 2\\]"):
        cache.crop(3)
    with pytest.raises(ValueError, match="crop length=-1"):
        cache.crop(-1)
    cache.crop(1)
    assert cache.length == 1
    with pytest.raises(ValueError, match="overflow"):
        cache.advance(4)
    with pytest.raises(ValueError, match="batch size mismatch: got 2 rows, the cache holds 1"):
        cache.update(0, torch.zeros(2, 2, 1, 3), torch.zeros(2, 2, 1, 3))


def test_new_cache_matches_the_model():
    decoder = make_decoder()
    cache = decoder.new_cache(3)
    assert cache.max_len == decoder.config.max_seq_len
    assert len(cache.keys) == decoder.config.n_layers
    assert cache.keys[0].shape == (3, 3, 24, 16)
    assert cache.keys[0].dtype == decoder.embed.weight.dtype


def test_padding_marks_follow_the_cache_through_crop_and_row_selection():
    cache = KVCache(n_layers=1, batch_size=3, n_heads=1, head_dim=2, max_len=6)
    assert cache.key_padding(3) is None  # no padding anywhere: the bias broadcasts over rows
    cache.mark_padding(torch.tensor([[True, False], [False, False], [True, True]]))
    cache.advance(2)
    cache.advance(2)  # positions written without marks hold tokens
    assert cache.key_padding(4).tolist() == [[True, False, False, False], [False] * 4, [True, True, False, False]]
    for layer_k in cache.keys:
        layer_k[:, 0, :4, 0] = torch.arange(3.0)[:, None]
    cache.select_rows(torch.tensor([2, 0]))
    assert cache.batch_size == 2 and cache.keys[0][:, 0, 0, 0].tolist() == [2.0, 0.0]
    assert cache.key_padding(2).tolist() == [[True, True], [True, False]]
    cache.crop(1)
    cache.mark_padding(torch.tensor([[False], [True]]))
    assert cache.key_padding(2).tolist() == [[True, False], [True, True]]
    with pytest.raises(ValueError, match="padding has 3 rows, the cache holds 2"):
        cache.mark_padding(torch.zeros(3, 1, dtype=torch.bool))


def test_a_left_padded_batch_decodes_as_each_row_alone():
    decoder = make_decoder()
    rows = [torch.randint(0, 101, (n,)) for n in (3, 7, 1)]
    width = 7
    tokens = torch.zeros(3, width, dtype=torch.long)
    padding = torch.ones(3, width, dtype=torch.bool)
    for i, row in enumerate(rows):
        tokens[i, width - len(row):] = row
        padding[i, width - len(row):] = False
    nxt = torch.randint(0, 101, (3, 2))
    with torch.no_grad():
        cache = decoder.new_cache(3)
        prefill = decoder(tokens, cache=cache, padding=padding)
        steps = [decoder(nxt[:, i:i + 1], cache=cache) for i in range(2)]
        for i, row in enumerate(rows):
            alone = decoder(torch.cat([row, nxt[i]])[None])
            torch.testing.assert_close(prefill[i, -1], alone[0, len(row) - 1], rtol=1e-5, atol=1e-5)
            for j in range(2):
                torch.testing.assert_close(steps[j][i, 0], alone[0, len(row) + j], rtol=1e-5, atol=1e-5)
        assert torch.isfinite(prefill).all()  # padding queries see only padding: finite, never NaN


def test_extra_layers_hold_adapter_slots():
    decoder = make_decoder()
    cache = decoder.new_cache(2, extra_layers=2)
    assert len(cache.keys) == decoder.config.n_layers + 2


def test_rows_cropped_to_their_own_lengths_leave_holes_that_compact_closes():
    """Row r keeps positions [0, lengths[r]); a shorter row's positions up to the longest
    row's end become padding (holes) and nothing moves. ``compact`` then moves each
    row's tokens right, in order, and drops the padding all rows share at the left."""
    cache = KVCache(n_layers=2, batch_size=3, n_heads=1, head_dim=1, max_len=8)
    cache.mark_padding(torch.tensor([[True, True, False, False, False, False],
                                     [False] * 6,
                                     [True, False, False, False, False, False]]))
    cache.advance(6)
    for store in (cache.keys, cache.values):
        for tensor in store:
            tensor[:, 0, :6, 0] = torch.arange(6.0) + 10 * torch.arange(3.0)[:, None]
    before = cache.keys[1].clone()
    cache.crop_rows([6, 3, 5])
    assert cache.length == 6 and torch.equal(cache.keys[1], before)
    assert cache.key_padding(6).tolist() == [[True, True, False, False, False, False],
                                             [False, False, False, True, True, True],
                                             [True, False, False, False, False, True]]
    cache.compact()
    assert cache.length == 4  # row 1 keeps 3 tokens and moves 3 right; every row had >= 2 padding
    assert cache.key_padding(4).tolist() == [[False] * 4, [True, False, False, False], [False] * 4]
    tokens = ~cache.key_padding(4)
    assert cache.keys[1][:, 0, :4, 0][tokens].tolist() == [2, 3, 4, 5, 10, 11, 12, 21, 22, 23, 24]
    assert torch.equal(cache.values[0][:, 0, :4, 0], cache.keys[1][:, 0, :4, 0])
    assert cache.key_padding(8).tolist() == [[False] * 4 + [False] * 4, [True] + [False] * 7, [False] * 8]
    cache.crop_rows([4, 3, 4])
    cache.compact()  # nothing moves but row 1 (and nothing is dropped: row 0 has no padding)
    assert cache.length == 4 and cache.keys[0][1, 0, 2:4, 0].tolist() == [10, 11]
    cache.compact()  # nothing to move: not counted
    assert cache.compactions == 2
    assert cache.key_padding(4)[1].tolist() == [True, True, False, False]
    with pytest.raises(ValueError, match=r"crop lengths \[5, 1\] are invalid: one per row \(3\)"):
        cache.crop_rows([5, 1])


def test_crop_rows_compacts_only_when_the_room_asked_for_is_missing():
    cache = KVCache(n_layers=1, batch_size=2, n_heads=1, head_dim=1, max_len=10)
    cache.advance(6)
    cache.crop_rows([6, 4], room=4)  # 4 positions left: the holes stay
    assert cache.length == 6 and cache.key_padding(6)[1].tolist() == [False] * 4 + [True] * 2
    cache.advance(2)
    cache.crop_rows([8, 7], room=4)  # 2 left: compacted (row 1's 2 holes + 1, row 0 none -> nothing dropped)
    assert cache.length == 8 and cache.key_padding(8)[1].tolist() == [True] * 3 + [False] * 5


@pytest.mark.parametrize("family", ["celerity", "llama"])
def test_holes_change_nothing_a_row_computes(family):
    """A batch whose rows kept different prefixes decodes, holes and all, as the same
    batch compacted and as each row alone (ALiBi's distances and RoPE's positions both
    count a row's tokens)."""
    from framework.families.registry import build_decoder

    torch.manual_seed(0)
    extra = {"family": "llama", "bias": False, "ffn_hidden": 64, "n_kv_heads": 1} if family == "llama" else {}
    decoder = build_decoder(ModelConfig(vocab_size=101, d_model=48, n_layers=3, n_heads=3, max_seq_len=32,
                                        attention="sdpa", **extra)).eval()
    tokens = torch.randint(0, 101, (3, 9))
    kept = [9, 5, 7]  # row r keeps its first kept[r] tokens of the 9 written
    nxt = torch.randint(0, 101, (3, 4))
    with torch.no_grad():
        holed, compacted = decoder.new_cache(3), decoder.new_cache(3)
        for cache in (holed, compacted):
            decoder(tokens, cache=cache)
            cache.crop_rows(kept)
        compacted.compact()
        assert holed.length == 9 and compacted.length == 9 and holed.key_padding(9)[1, 5:].all()
        for cache in (holed, compacted):
            # two steps, then a chunk of two (a verification's shape)
            logits = torch.cat([decoder(nxt[:, :1], cache=cache), decoder(nxt[:, 1:2], cache=cache),
                                decoder(nxt[:, 2:], cache=cache)], dim=1)
            for row, n in enumerate(kept):
                alone = decoder(torch.cat([tokens[row, :n], nxt[row]])[None])[0]
                torch.testing.assert_close(logits[row], alone[n:], rtol=1e-5, atol=1e-5)

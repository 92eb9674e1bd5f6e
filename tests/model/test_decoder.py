"""Decoder: architecture, early exit, layer skipping and the checks on its arguments."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from framework.config import ModelConfig
from framework.layer_dropout import DropPlan, LayerDrop
from framework.model.decoder import Decoder

VOCAB = 53


def make_decoder(**overrides) -> Decoder:
    torch.manual_seed(0)
    cfg = ModelConfig(**{"vocab_size": VOCAB, "d_model": 32, "n_layers": 4, "n_heads": 2,
                         "max_seq_len": 16, **overrides})
    return Decoder(cfg)


def test_the_public_name_is_the_decoder():
    from framework import model

    assert model.Decoder is Decoder  # DESIGN.md's `framework.model.Decoder`


def manual_logits(decoder: Decoder, tokens: torch.Tensor, layers) -> torch.Tensor:
    """Pre-LN blocks written out from the submodules, then the final norm and head."""
    h = decoder.embed(tokens)
    bias = decoder.attention_bias(tokens.shape[1], None)
    for index in layers:
        block = decoder.blocks[index]
        h = h + block.attn(block.attn_norm(h), bias, None)
        x = block.ffn_norm(h)
        h = h + block.ffn.down(torch.relu(block.ffn.up(x)) ** 2)  # squared ReLU
    return decoder.head(decoder.norm(h))


def test_shapes_and_architecture():
    decoder = make_decoder()
    cfg = decoder.config
    assert decoder.blocks[0].ffn.up.out_features == 8 * cfg.d_model
    assert decoder.head.weight.data_ptr() != decoder.embed.weight.data_ptr()  # untied
    assert not any("pos" in name for name, _ in decoder.named_parameters())  # ALiBi: no positions
    tokens = torch.randint(0, VOCAB, (3, 9))
    assert decoder(tokens).shape == (3, 9, VOCAB)
    d, f, a = cfg.d_model, cfg.ffn_dim, cfg.attn_dim
    per_block = (d * 3 * a + 3 * a) + (a * d + d) + (d * f + f) + (f * d + d) + 4 * d
    assert decoder.num_parameters(non_embedding=True) == cfg.n_layers * per_block + 2 * d
    assert decoder.num_parameters() == decoder.num_parameters(non_embedding=True) + 2 * VOCAB * d


@pytest.mark.parametrize("kwargs, layers", [
    ({}, [0, 1, 2, 3]),
    ({"exit_layer": 1}, [0]),
    ({"exit_layer": 3}, [0, 1, 2]),
    ({"skip_layers": [1, 3]}, [0, 2]),
    ({"exit_layer": 3, "skip_layers": (0,)}, [1, 2]),
    ({"skip_layers": range(4)}, []),
    ({"exit_layer": np.int64(2), "skip_layers": [np.int64(1)]}, [0]),
])
def test_exit_and_skip_run_exactly_those_blocks(kwargs, layers):
    decoder = make_decoder()
    tokens = torch.randint(0, VOCAB, (2, 8))
    with torch.no_grad():
        torch.testing.assert_close(decoder(tokens, **kwargs), manual_logits(decoder, tokens, layers),
                                   rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kwargs, message", [
    ({"exit_layer": 0}, "exit_layer=0 is invalid: must be an integer in 1..4"),
    ({"exit_layer": 5}, "exit_layer=5 is invalid"),
    ({"exit_layer": -1}, "exit_layer=-1"),
    ({"exit_layer": 2.0}, "exit_layer=2.0"),
    ({"exit_layer": True}, "exit_layer=True"),
    ({"skip_layers": [4]}, "skip_layers=\\[4\\] is invalid: layers must be in 0..3"),
    ({"skip_layers": [1, -1]}, "skip_layers=\\[-1, 1\\]"),
    ({"skip_layers": ["1"]}, "skip_layers=\\['1'\\]"),
])
def test_bad_exit_and_skip_arguments_raise(kwargs, message):
    decoder = make_decoder()
    with pytest.raises(ValueError, match=message):
        decoder(torch.zeros(1, 3, dtype=torch.long), **kwargs)


def test_all_layers_returns_every_exit_point():
    decoder = make_decoder()
    tokens = torch.randint(0, VOCAB, (2, 6))
    with torch.no_grad():
        states = decoder.hidden(tokens, all_layers=True, skip_layers=[2])
        assert len(states) == 3
        for exit_layer, state in zip([1, 2, 4], states):
            torch.testing.assert_close(decoder.logits(state),
                                       decoder(tokens, exit_layer=exit_layer, skip_layers=[2]))


def test_causal_future_tokens_do_not_change_past_logits():
    decoder = make_decoder()
    tokens = torch.randint(0, VOCAB, (1, 10))
    changed = tokens.clone()
    changed[0, 6:] = (changed[0, 6:] + 1) % VOCAB
    with torch.no_grad():
        a, b = decoder(tokens), decoder(changed)
    torch.testing.assert_close(a[:, :6], b[:, :6])
    assert not torch.allclose(a[:, 6:], b[:, 6:])


def test_parametrization_multipliers_enter_the_forward():
    plain = make_decoder()
    scaled = make_decoder(logit_multiplier=0.25, residual_multiplier=0.5)
    scaled.load_state_dict(plain.state_dict())
    tokens = torch.randint(0, VOCAB, (2, 5))
    with torch.no_grad():
        torch.testing.assert_close(scaled(tokens, skip_layers=range(4)), 0.25 * plain(tokens, skip_layers=range(4)))
        h = plain.embed(tokens)
        bias = plain.attention_bias(5, None)
        block = plain.blocks[0]
        h = h + 0.5 * block.attn(block.attn_norm(h), bias, None)
        h = h + 0.5 * block.ffn(block.ffn_norm(h))
        torch.testing.assert_close(scaled(tokens, exit_layer=1), 0.25 * plain.logits(h))


def test_plan_is_checked_against_the_model_and_the_batch():
    decoder = make_decoder()
    tokens = torch.zeros(2, 4, dtype=torch.long)
    keep = torch.tensor([True, False])
    with pytest.raises(ValueError, match="plan has 3 layers; the model has 4"):
        decoder(tokens, plan=DropPlan.from_masks([keep] * 3, [1.0] * 3))
    with pytest.raises(ValueError, match="plan.batch_size=3 is invalid: the tokens have 2 rows"):
        decoder(tokens, plan=DropPlan.from_masks([torch.ones(3, dtype=torch.bool)] * 4, [1.0] * 4))
    with pytest.raises(ValueError, match="plan and cache are exclusive"):
        decoder(tokens, plan=DropPlan.from_masks([keep] * 4, [1.0] * 4), cache=decoder.new_cache(2))


def test_training_step_reaches_every_parameter_and_learns():
    decoder = make_decoder()
    tokens = torch.randint(0, VOCAB, (4, 9))
    optimizer = torch.optim.AdamW(decoder.parameters(), lr=3e-3)
    losses = []
    for _ in range(5):
        optimizer.zero_grad()
        logits = decoder(tokens[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
        loss.backward()
        assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in decoder.parameters())
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]


def test_meta_construction_then_materialise_restores_slopes():
    with torch.device("meta"):
        decoder = Decoder(ModelConfig(vocab_size=VOCAB, d_model=40, n_layers=2, n_heads=5))
    decoder = decoder.to_empty(device="cpu")
    decoder.init_weights(std=0.01)
    assert decoder.blocks[1].attn.slopes.device.type == "cpu"
    assert decoder.blocks[1].attn.slopes.tolist() == pytest.approx([2 ** -2, 2 ** -4, 2 ** -6, 2 ** -8, 2 ** -1])
    assert decoder.embed.weight.std().item() == pytest.approx(0.01, rel=0.1)
    assert torch.all(decoder.blocks[0].attn.qkv.bias == 0)


def test_step_is_the_forward():
    """Every way in (forward, hidden, a stream resumed above its embedding) is one step."""
    decoder = Decoder(ModelConfig(vocab_size=50, d_model=16, n_layers=4, n_heads=2, max_seq_len=16,
                                  attention="sdpa")).eval()
    tokens = torch.randint(0, 50, (2, 6))
    with torch.no_grad():
        embedded = decoder.step(tokens, layers=[]).hidden
        assert torch.equal(embedded, decoder.embed(tokens))
        out = decoder.step(embedded, layers=[0, 2, 3], states=True)
        assert torch.equal(out.hidden, decoder.hidden(tokens, skip_layers=[1]))
        assert len(out.states) == 3 and torch.equal(out.states[-1], out.hidden)
        assert torch.equal(decoder.logits(out.hidden), decoder(tokens, skip_layers=[1]))


def test_positions_that_leave_keep_their_state():
    """leave: a teacher-forced position that leaves at exit K keeps the state it had
    there; the others run on."""
    torch.manual_seed(0)
    decoder = Decoder(ModelConfig(vocab_size=50, d_model=16, n_layers=4, n_heads=2, max_seq_len=16,
                                  attention="sdpa")).eval()
    tokens = torch.randint(0, 50, (2, 6))
    leaving = torch.zeros(2, 6, dtype=torch.bool)
    leaving[0, 2] = leaving[1, 5] = True
    with torch.no_grad():
        out = decoder.step(tokens, exits={2: None}, leave=lambda k, read, running: leaving)
        at_exit, full = decoder.hidden(tokens, exit_layer=2), decoder.hidden(tokens)
        assert torch.equal(out.hidden[leaving], at_exit[leaving]) and torch.equal(out.running, ~leaving)
        assert torch.allclose(out.hidden[0, :2], full[0, :2], atol=1e-6)  # causal: before the kept state
        assert (out.hidden[0, 3:] - full[0, 3:]).abs().max() > 1e-5  # after it: they attend to it


def test_updating_some_rows_keeps_the_others_and_writes_every_rows_k_v():
    """A LayerDrop keeping rows R, with a cache: rows in R take the block's update, the
    others keep their state; the cache gets every row's K/V computed from the state it has
    (CALM's propagation)."""
    torch.manual_seed(0)
    decoder = Decoder(ModelConfig(vocab_size=50, d_model=16, n_layers=2, n_heads=2, max_seq_len=16,
                                  attention="sdpa")).double().eval()
    block = decoder.blocks[1]
    h = torch.randn(3, 1, 16, dtype=torch.float64)
    rows = torch.tensor([0, 2])
    with torch.no_grad():
        cache, reference_cache = decoder.new_cache(3, 4), decoder.new_cache(3, 4)
        bias = decoder.attention_bias(1, cache)
        updated = block(h, bias, LayerDrop(rows, rows, 1.0), cache)
        full = block(h, bias, None, reference_cache)
    torch.testing.assert_close(updated[rows], full[rows], rtol=0, atol=1e-12)
    assert torch.equal(updated[1], h[1])
    assert torch.equal(cache.keys[1][:, :, :1], reference_cache.keys[1][:, :, :1])


def step_decoder() -> Decoder:
    torch.manual_seed(0)
    return Decoder(ModelConfig(vocab_size=50, d_model=16, n_layers=4, n_heads=2, max_seq_len=16,
                               attention="sdpa")).double().eval()


def test_step_through_the_cache_is_the_forward():
    """A prefill then one-token steps give the logits of one forward over the whole
    sequence; a padded row gives its unpadded logits."""
    decoder = step_decoder()
    tokens = torch.randint(0, 50, (2, 7))
    with torch.no_grad():
        whole = decoder(tokens)
        cache = decoder.new_cache(2, 8)
        parts = [decoder.step(tokens[:, :4], cache).hidden]
        parts += [decoder.step(tokens[:, i:i + 1], cache).hidden for i in range(4, 7)]
        assert cache.length == 7
        torch.testing.assert_close(decoder.logits(torch.cat(parts, 1)), whole, rtol=0, atol=1e-10)
        padded = torch.cat([torch.zeros(1, 2, dtype=torch.long), tokens[:1, :5]], 1)
        padding = torch.tensor([[True, True] + [False] * 5])
        out = decoder.step(padded, decoder.new_cache(1, 8), padding=padding)
        torch.testing.assert_close(decoder.logits(out.hidden[:, 2:]), whole[:1, :5], rtol=0, atol=1e-10)


def test_step_resumes_from_a_stream_and_reads_exits():
    """Blocks 0..1 then 2..3 resumed from their stream (the cache cropped back in between)
    are the whole step; exit 2 reads the stream after blocks 0..1."""
    decoder = step_decoder()
    tokens = torch.randint(0, 50, (2, 5))
    with torch.no_grad():
        full = decoder.step(tokens, decoder.new_cache(2, 8), exits={2: None})
        cache = decoder.new_cache(2, 8)
        lower = decoder.step(tokens, cache, layers=range(2))
        assert cache.length == 5
        cache.crop(0)
        upper = decoder.step(lower.hidden, cache, layers=range(2, 4))
        assert cache.length == 5 and full.running is None
    torch.testing.assert_close(upper.hidden, full.hidden, rtol=0, atol=1e-12)
    torch.testing.assert_close(full.reads[2], lower.hidden, rtol=0, atol=1e-12)


def test_rows_that_leave_at_an_exit_keep_their_state_and_write_later_k_v_from_it():
    decoder = step_decoder()
    tokens = torch.randint(0, 50, (3, 1))
    with torch.no_grad():
        cache = decoder.new_cache(3, 4)
        out = decoder.step(tokens, cache, exits={1: None}, leave=lambda k, read, running: running & (
            torch.arange(3)[:, None] == 1))
        assert out.running[:, 0].nonzero().flatten().tolist() == [0, 2]
        assert torch.equal(out.hidden[1], out.reads[1][1])  # row 1 left at exit 1
        full = decoder.step(tokens, decoder.new_cache(3, 4))
        torch.testing.assert_close(out.hidden[[0, 2]], full.hidden[[0, 2]], rtol=0, atol=1e-12)
        reference = decoder.new_cache(3, 4)
        decoder.blocks[3].attn(decoder.blocks[3].attn_norm(out.reads[1]), decoder.attention_bias(1, reference),
                               reference)
        torch.testing.assert_close(cache.keys[3][1, :, :1], reference.keys[3][1, :, :1], rtol=0, atol=1e-12)


def test_no_module_outside_the_model_builds_a_forward_by_hand():
    """Decoder.step is the one forward: eval/ and the rest of framework/ neither embed,
    build an attention bias nor run blocks themselves (a route's adapter read included)."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    by_hand = re.compile(r"\.(embed|attention_bias|_run_blocks|run_blocks)\(|\.blocks\[[^\]]+\]\(|(?<!self)\._(adapter|leaves)\(")
    found = [f"{path.relative_to(root)}:{number}: {line.strip()}"
             for folder in ("eval", "framework") for path in sorted((root / folder).rglob("*.py"))
             if not path.is_relative_to(root / "framework" / "model") and not path.is_relative_to(
                 root / "framework" / "families")
             for number, line in enumerate(path.read_text().splitlines(), start=1) if by_hand.search(line)]
    assert found == []


def test_rows_is_refused_outside_a_decoding_step():
    decoder = make_decoder()
    with torch.no_grad(), pytest.raises(ValueError, match="rows is for a decoding step"):
        decoder.step(torch.zeros(2, 3, dtype=torch.long), decoder.new_cache(2), rows=torch.tensor([0]))

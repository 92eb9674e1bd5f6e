"""Dynamic early exit: the threshold's two ends, the propagated K/V, the one-pass
reference, and the quality curve's command."""

from __future__ import annotations


import pytest
import torch

from eval.adapters.exit_adapters import ExitAdapters
from eval.decoding.dynamic_exit import DynamicExit, confidence, default_candidates, dynamic_forward
from eval.decoding.batch import BatchGenerator
from eval.decoding.static_route import StaticRoute

from tests.eval.decoding.test_batch import LAYERS, VOCAB, tiny_model


@pytest.fixture(scope="module")
def model():
    return tiny_model(seed=2)


@pytest.fixture(scope="module")
def adapters(model):
    adapters = ExitAdapters(model.config, [1, 3])
    adapters.initialise(model, "random")
    return adapters.double().eval()


@pytest.fixture(scope="module")
def prompts():
    gen = torch.Generator().manual_seed(4)
    return [torch.randint(0, VOCAB, (n,), generator=gen).tolist() for n in (1, 3, 6, 11)]


def test_confidence_is_the_gap_between_the_two_most_likely_tokens():
    logits = torch.log(torch.tensor([[0.6, 0.3, 0.1], [0.4, 0.4, 0.2]]))
    assert confidence(logits).tolist() == pytest.approx([0.3, 0.0])


@pytest.mark.parametrize("use_adapters", [False, True], ids=["shared_head", "adapters"])
def test_threshold_one_is_the_full_model(model, prompts, adapters, use_adapters):
    route = DynamicExit(model, threshold=1.0, exits=[1, 2, 3] if not use_adapters else None,
                        adapters=adapters if use_adapters else None)
    items, stats = BatchGenerator(model, route).generate(prompts, 12)
    full, _ = BatchGenerator(model).generate(prompts, 12)
    assert [i.tokens for i in items] == [i.tokens for i in full]
    assert stats.block_evaluations == LAYERS * stats.new_tokens


def test_a_padded_batch_gives_each_prompt_its_own_tokens_and_rows_leave_at_eos(model, prompts):
    route = DynamicExit(model, threshold=0.02, exits=[1, 2, 3])
    alone = [BatchGenerator(model, route).generate([p], 12)[0][0] for p in prompts]
    eos = alone[1].tokens[3]
    batched, _ = BatchGenerator(model, route).generate(prompts, 12, eos_id=eos)
    for item, single in zip(batched, alone):
        cut = single.tokens.index(eos) if eos in single.tokens else 12
        assert item.tokens == single.tokens[:cut] and item.blocks == single.blocks[:cut]
    assert len({b for item in alone for b in item.blocks}) > 1


@pytest.mark.parametrize("use_adapters", [False, True], ids=["shared_head", "adapters"])
def test_threshold_zero_exits_every_token_at_the_first_candidate(model, prompts, adapters, use_adapters):
    first = 2 if not use_adapters else 1
    route = DynamicExit(model, threshold=0.0, exits=[2, 3] if not use_adapters else None,
                        adapters=adapters if use_adapters else None)
    items, _ = BatchGenerator(model, route).generate(prompts, 10)
    cost = first + (1 if use_adapters else 0)  # the blocks to the exit, plus the adapter's
    assert all(item.blocks == [cost] * 10 for item in items)
    # ... and the tokens are the exit's own: those of the static exit route.
    adapter = adapters.blocks[str(first)] if use_adapters else None
    static, _ = BatchGenerator(model, StaticRoute(model, exit_layer=first, adapter=adapter)).generate(prompts, 10)
    if first == 1 or use_adapters is False:
        # Exiting at the first candidate every time, the K/V of the blocks below the
        # exit are the static route's: the same tokens.
        assert [i.tokens for i in items] == [i.tokens for i in static]


@pytest.mark.parametrize("threshold", [0.01, 0.02, 0.05])  # around this random model's confidences
def test_incremental_decoding_equals_the_one_pass_reference(model, adapters, threshold):
    """Teacher-forced, token by token with the cache vs all positions at once."""
    tokens = torch.randint(0, VOCAB, (3, 14), generator=torch.Generator().manual_seed(int(threshold * 1000)))
    for route in (DynamicExit(model, threshold=threshold, exits=[1, 2, 3]),
                  DynamicExit(model, threshold=threshold, adapters=adapters)):
        hidden, exits = dynamic_forward(model, route, tokens)
        cache = model.new_cache(3, 14, extra_layers=route.extra_layers)
        steps, chosen = [], []
        with torch.inference_mode():
            reference = model.logits(hidden)
            for t in range(14):
                logits, blocks = route.step(model, tokens[:, t:t + 1], cache)
                steps.append(logits)
                chosen.append(blocks)
        torch.testing.assert_close(torch.stack(steps, 1), reference, rtol=0, atol=1e-10)
        # with adapters, a token also ran the adapter of every candidate it reached
        adapter_blocks = 0 if route.adapters is None else sum((exits >= e).long() for e in route.candidates)
        assert torch.equal(torch.stack(chosen, 1), exits + adapter_blocks)
        assert len(set(exits.flatten().tolist())) > 1  # tokens really left at different exits


def test_an_exited_token_writes_the_skipped_layers_k_v_from_its_exit_state(model):
    """CALM's state propagation: layer l's cached K/V of an exited token are layer l's own
    norm + projection applied to the state the token left with."""
    route = DynamicExit(model, threshold=0.0, exits=[1])
    cache = model.new_cache(1, 4)
    token = torch.tensor([[7]])
    with torch.inference_mode():
        route.step(model, token, cache)
        state = model.blocks[0](model.embed(token), model.attention_bias(1))  # the stream after block 0
        for layer in range(1, LAYERS):
            attn = model.blocks[layer].attn
            qkv = attn.qkv(model.blocks[layer].attn_norm(state)).view(1, 1, 3, attn.n_heads, attn.head_dim)
            expected_k = qkv[:, :, 1].transpose(1, 2)
            torch.testing.assert_close(cache.keys[layer][:, :, :1], expected_k, rtol=0, atol=1e-12)


@pytest.mark.parametrize("kwargs, message", [
    ({"threshold": 1.5}, r"threshold=1.5 is invalid: must be in \[0, 1\]"),
    ({"threshold": -0.1}, r"threshold=-0.1 is invalid"),
    ({"exits": [0]}, r"exits=\[0\] is invalid: candidate exits must be in 1..3"),
    ({"exits": [4]}, r"exits=\[4\] is invalid"),
])
def test_bad_settings_are_one_line_errors(model, kwargs, message):
    with pytest.raises(ValueError, match=message):
        DynamicExit(model, **kwargs)


def test_candidates_must_be_adapter_exits(model, adapters):
    with pytest.raises(ValueError, match=r"the adapters have exits \[1, 3\] only"):
        DynamicExit(model, adapters=adapters, exits=[2])
    assert DynamicExit(model, adapters=adapters).candidates == [1, 3]
    assert default_candidates(6) == [2, 3, 4] and default_candidates(2) == [1]

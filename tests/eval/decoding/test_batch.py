"""Batched decoding: a padded batch gives every prompt the tokens it gets alone, the
cache gives what recomputing gives, and sequences end at EOS, stop strings and length.

The models are random float64 decoders with a wide init: two logits never tie by
rounding, so any difference in a greedy token is a real bug.
"""

from __future__ import annotations

import pytest
import torch

from eval.adapters.exit_adapters import ExitAdapters
from eval.decoding.batch import BatchGenerator, generate_in_batches, left_padded
from eval.decoding.static_route import StaticRoute
from eval.decoding.transcripts import StopStrings, Transcripts
from eval.decoding.sampling import Sampling
from framework.model.decoder import Decoder
from tests.helpers.tiny_decoder import tiny_decoder

VOCAB, LAYERS = 64, 4


def tiny_model(seed: int = 0) -> Decoder:
    return tiny_decoder(seed, LAYERS, 96, vocab_size=VOCAB, n_heads=2, std=0.3, double=True)


@pytest.fixture(scope="module")
def model() -> Decoder:
    return tiny_model()


@pytest.fixture(scope="module")
def adapter(model):
    adapters = ExitAdapters(model.config, [2])
    adapters.initialise(model, "random")
    return adapters.double().eval().blocks["2"]


@pytest.fixture(scope="module")
def prompts():
    gen = torch.Generator().manual_seed(1)
    return [torch.randint(0, VOCAB, (n,), generator=gen).tolist() for n in (1, 2, 3, 5, 8, 13)]


def slow_greedy(model: Decoder, prompt: list[int], steps: int, adapter=None, **forward) -> list[int]:
    """A whole forward per token, no cache."""
    tokens = list(prompt)
    with torch.no_grad():
        for _ in range(steps):
            x = torch.tensor([tokens])
            if adapter is None:
                logits = model(x, **forward)
            else:
                h = model.hidden(x, **forward)
                logits = model.logits(adapter(h, model.attention_bias(x.shape[1], None)))
            tokens.append(int(logits[0, -1].argmax()))
    return tokens[len(prompt):]


ROUTES = [{}, {"exit_layer": 2}, {"skip_layers": (1,)}, {"skip_layers": (0, 3)}, {"exit_layer": 3, "skip_layers": (1,)}]


@pytest.mark.parametrize("forward", ROUTES, ids=str)
def test_a_padded_batch_gives_each_prompt_its_own_greedy_tokens(model, prompts, forward):
    generator = BatchGenerator(model, StaticRoute(model, **forward))
    batched, stats = generator.generate(prompts, 12)
    for prompt, item in zip(prompts, batched):
        assert item.tokens == slow_greedy(model, prompt, 12, **forward), prompt
        assert generator.generate([prompt], 12)[0][0].tokens == item.tokens
        assert item.finish_reason == "length"
    blocks = len(model.active_layers(forward.get("exit_layer"), forward.get("skip_layers", ())))
    assert stats.new_tokens == 12 * len(prompts) and stats.block_evaluations == blocks * stats.new_tokens


def test_the_adapter_route_reads_the_exit_through_the_adapter(model, prompts, adapter):
    route = StaticRoute(model, exit_layer=2, adapter=adapter)
    batched, _ = BatchGenerator(model, route).generate(prompts, 10)
    for prompt, item in zip(prompts, batched):
        assert item.tokens == slow_greedy(model, prompt, 10, adapter=adapter, exit_layer=2)
    assert route.blocks_per_token == 3 and route.extra_layers == 1
    with pytest.raises(ValueError, match="an exit adapter reads one exit"):
        StaticRoute(model, adapter=adapter)


def test_sampled_continuations_do_not_depend_on_the_batch(model, prompts):
    sampling = Sampling(temperature=1.3, top_k=20, top_p=0.95)
    generator = BatchGenerator(model, sampling=sampling, seed=7)
    batched, _ = generator.generate(prompts, 15)
    for number, (prompt, item) in enumerate(zip(prompts, batched)):
        assert generator.generate([prompt], 15, numbers=[number])[0][0].tokens == item.tokens
    again, _ = BatchGenerator(model, sampling=sampling, seed=7).generate(prompts, 15)
    assert [i.tokens for i in again] == [i.tokens for i in batched]
    other, _ = BatchGenerator(model, sampling=sampling, seed=8).generate(prompts, 15)
    assert [i.tokens for i in other] != [i.tokens for i in batched]
    assert [i.tokens for i in batched] != [slow_greedy(model, p, 15) for p in prompts]


def test_a_sampled_prompt_gives_its_text_at_any_position_and_alone(model, prompts):
    """Seeded from the prompt's tokens (the default): its place in the input changes nothing."""
    generator = BatchGenerator(model, sampling=Sampling(temperature=1.0), seed=5)
    batched, _ = generator.generate(prompts, 12)
    for prompt, item in zip(prompts, batched):
        assert generator.generate([prompt], 12)[0][0].tokens == item.tokens
    twice, _ = generator.generate([prompts[2], prompts[2]], 12)
    assert twice[0].tokens == twice[1].tokens == batched[2].tokens


def test_seeding_by_position_gives_repeated_prompts_their_own_texts(model, prompts):
    generator = BatchGenerator(model, sampling=Sampling(temperature=1.0), seed=5, seed_by="position")
    twice, _ = generator.generate([prompts[2], prompts[2]], 12)
    assert twice[0].tokens != twice[1].tokens
    assert generator.generate([prompts[2]], 12, numbers=[1])[0][0].tokens == twice[1].tokens
    with pytest.raises(ValueError, match="seed_by='index' is invalid: allowed: prompt, position"):
        BatchGenerator(model, seed_by="index")


def test_in_batches_keeps_the_prompts_order_and_their_outputs(model, prompts):
    generator = BatchGenerator(model, sampling=Sampling(temperature=1.0), seed=3)
    whole, _ = generator.generate(prompts, 9)
    seen = []
    chunked, stats = generate_in_batches(generator.generate, prompts, 4, max_new_tokens=9,
                                         on_tokens=lambda n, ids: seen.append(n))
    assert [i.tokens for i in chunked] == [i.tokens for i in whole]
    assert sorted(set(seen)) == list(range(len(prompts))) and stats.sequences == len(prompts)


def test_a_sequence_ends_before_eos_and_leaves_the_batch(model, prompts):
    reference = [slow_greedy(model, p, 12) for p in prompts]
    eos = reference[2][4]  # the third prompt writes it (by its fifth token)
    items, stats = BatchGenerator(model).generate(prompts, 12, eos_id=eos)
    for item, ref in zip(items, reference):
        cut = ref.index(eos) if eos in ref else len(ref)
        assert item.tokens == ref[:cut]
        assert item.finish_reason == ("eos" if eos in ref else "length")
    assert items[2].finish_reason == "eos" and len(items[2].tokens) <= 4
    assert stats.steps == 12  # the longest sequence still ran every step


def test_stop_strings_end_a_sequence_at_the_token_that_completes_them(model, prompts):
    decode = lambda ids: "".join(chr(65 + t % 26) for t in ids)  # noqa: E731  a fake detokenizer
    reference = slow_greedy(model, prompts[3], 12)
    text = decode(reference)
    stop = StopStrings([text[5:7]], decode)
    items, _ = BatchGenerator(model).generate([prompts[3]], 12, stop=stop)
    end = text.index(text[5:7]) + 2  # the first occurrence, possibly before position 5
    assert items[0].tokens == reference[:end] and items[0].finish_reason == "stop"
    assert stop.cut(decode(items[0].tokens)) == text[:end - 2]


def test_stop_strings_look_only_at_the_tail():
    decode = lambda ids: "".join(chr(t) for t in ids)  # noqa: E731
    stop = StopStrings(["xy", ""], decode)
    assert stop.tail == 4 * 2 + 4
    assert stop.hit([ord(c) for c in "abcxy"]) and not stop.hit([ord(c) for c in "abcx"])
    assert stop.cut("abxyzxy") == "ab" and StopStrings([], decode).cut("abc") == "abc"


def test_transcripts_count_and_finish():
    book = Transcripts(2, 3, eos_id=9)
    assert book.add(0, [1, 2], [4, 4]) == 2 and book.add(1, [9], [4]) == 0
    assert book.items[1].finish_reason == "eos" and book.finished_rows().tolist() == [0]
    assert book.add(0, [3, 4], [4, 4]) == 1 and book.items[0].tokens == [1, 2, 3]
    assert book.items[0].finish_reason == "length" and book.finished_rows().tolist() == [] and book.done
    with pytest.raises(ValueError, match="max_new_tokens=0 is invalid"):
        Transcripts(1, 0)


def test_left_padding_and_bad_prompts(model):
    tokens, padding = left_padded([[5], [1, 2, 3]], torch.device("cpu"))
    assert tokens.tolist() == [[0, 0, 5], [1, 2, 3]]
    assert padding.tolist() == [[True, True, False], [False, False, False]]
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        BatchGenerator(model).generate([[1], []], 3)
    with pytest.raises(ValueError, match="no prompts"):
        BatchGenerator(model).generate([], 3)

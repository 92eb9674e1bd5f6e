"""Decoding on an imported Hugging Face Llama: greedy tokens identical to transformers'
``generate`` (left-padded batch), and every route of the decoding toolkit on it."""

from __future__ import annotations

import pytest
import torch

from eval.adapters.exit_adapters import ExitAdapters
from eval.decoding.batch import BatchGenerator
from eval.decoding.drafts import ExitDraft, SkipDraft
from eval.decoding.speculative import SelfSpeculativeDecoder
from eval.decoding.static_route import StaticRoute
from framework.checkpoint import load_decoder
from tests.helpers.hf_llama import VOCAB, tiny_hf_llama

PROMPTS = [[5, 9, 17, 3, 44, 12, 8], [61, 2], [7, 7, 30, 90]]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hf") / "llama"
    # A wide init: no two logits tie by rounding, so a differing token is a real difference.
    hf = tiny_hf_llama(folder, std=0.3, tie=True).double()
    decoder, _ = load_decoder(folder)
    return hf, decoder.double()


def hf_greedy(hf, prompts, new_tokens):
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    out = hf.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens, do_sample=False,
                      pad_token_id=0, eos_token_id=None)
    return out[:, width:].tolist()


def test_greedy_generate_is_token_identical_to_transformers(pair):
    hf, decoder = pair
    expected = hf_greedy(hf, PROMPTS, 12)
    ours, _ = BatchGenerator(decoder).generate(PROMPTS, 12)
    assert [t.tokens for t in ours] == expected
    alone = [BatchGenerator(decoder).generate([p], 12)[0][0].tokens for p in PROMPTS]
    assert alone == expected


def test_exit_and_skip_routes_equal_a_forward_without_cache(pair):
    _, decoder = pair
    for route in ({"exit_layer": 2}, {"skip_layers": (1,)}):
        transcripts, _ = BatchGenerator(decoder, StaticRoute(decoder, **route)).generate(PROMPTS, 6)
        for prompt, transcript in zip(PROMPTS, transcripts):
            tokens = list(prompt)
            with torch.no_grad():
                for _ in range(6):
                    tokens.append(int(decoder(torch.tensor([tokens]), **route)[0, -1].argmax()))
            assert transcript.tokens == tokens[len(prompt):]


def test_an_exit_adapter_of_the_llama_family_decodes_like_its_slow_forward(pair):
    _, decoder = pair
    adapters = ExitAdapters(decoder.config, [2])
    adapters.initialise(decoder, "last")
    adapter = adapters.double().eval().blocks["2"]
    assert type(adapter).__name__ == "LlamaBlock"
    transcripts, _ = BatchGenerator(decoder, StaticRoute(decoder, exit_layer=2, adapter=adapter)).generate(PROMPTS, 5)
    for prompt, transcript in zip(PROMPTS, transcripts):
        tokens = list(prompt)
        with torch.no_grad():
            for _ in range(5):
                x = torch.tensor([tokens])
                h = decoder.hidden(x, exit_layer=2)
                logits = decoder.logits(adapter(h, decoder.attention_bias(x.shape[1], None)))
                tokens.append(int(logits[0, -1].argmax()))
        assert transcript.tokens == tokens[len(prompt):]


@pytest.mark.parametrize("draft", ["skip", "exit"])
def test_self_speculative_decoding_is_lossless_on_the_imported_model(pair, draft):
    hf, decoder = pair
    expected = hf_greedy(hf, PROMPTS, 16)
    speculative = SelfSpeculativeDecoder(decoder, SkipDraft((1, 2)) if draft == "skip" else ExitDraft(2), gamma=3)
    transcripts, _ = speculative.generate_batch(PROMPTS, 16)
    assert [t.tokens for t in transcripts] == expected

"""The mode registry: every mode module is found, parses its spec, builds a decoder,
and no setting is accepted by a mode that does not read it."""

from __future__ import annotations

import pkgutil
from pathlib import Path

import pytest

import eval.decoding.modes as registry
from eval.adapters.exit_adapters import ExitAdapters
from eval.decoding import modes
from eval.decoding.sampling import Sampling
from tests.eval.decoding.test_batch import LAYERS, tiny_model


@pytest.fixture(scope="module")
def model():
    return tiny_model(3)


@pytest.fixture(scope="module")
def adapters(model):
    loaded = ExitAdapters(model.config, [1, 2])
    loaded.initialise(model, "random")
    return loaded.double().eval()


def test_every_module_of_the_package_is_a_mode():
    names = {info.name for info in pkgutil.iter_modules([str(Path(registry.__file__).parent)])}
    assert set(modes.modes()) == names == {"full", "exit", "skip", "speculative", "dynamic"}
    assert list(modes.modes())[0] == "full"


@pytest.mark.parametrize("spec", ["full", "exit:2", "exit:4", "skip:1,3", "speculative", "dynamic"])
def test_every_mode_builds_a_decoder_that_writes_the_asked_tokens(model, spec):
    prompts = [[1, 2, 3], [4]]
    items, stats = modes.decoder(spec, model)(prompts, 6)
    assert [len(item.tokens) for item in items] == [6, 6] and stats.new_tokens == 12
    if spec in ("speculative", "exit:4"):  # lossless / the full model: full's greedy text
        full, _ = modes.decoder("full", model)(prompts, 6)
        assert [i.tokens for i in items] == [i.tokens for i in full]


def test_settings_reach_the_mode_that_reads_them(model, adapters):
    prompts = [[5, 6, 7]]
    sampled = modes.Settings(sampling=Sampling(temperature=1.0), seed=3)
    one, _ = modes.decoder("full", model, sampled)(prompts, 8)
    two, _ = modes.decoder("full", model, sampled)(prompts, 8)
    greedy, _ = modes.decoder("full", model)(prompts, 8)
    assert one[0].tokens == two[0].tokens != greedy[0].tokens
    _, stats = modes.decoder("dynamic", model, modes.Settings(threshold=0.0, exits="1"))(prompts, 8)
    assert stats.block_evaluations == 8  # every token left at exit 1
    _, stats = modes.decoder("exit:2", model, modes.Settings(adapters=adapters))(prompts, 8)
    assert stats.block_evaluations == 8 * 3  # blocks 0, 1 and the adapter
    _, stats = modes.decoder("speculative", model, modes.Settings(gamma=2, draft="exit:1"))(prompts, 8)
    assert stats.rounds >= 8 // 3


@pytest.mark.parametrize("spec, settings, message", [
    ("full", {"gamma": 3}, "--gamma is for --mode speculative only (the mode given is 'full')"),
    ("full", {"adaptive": True}, "--adaptive is for --mode speculative only"),
    ("exit:2", {"threshold": 0.5}, "--threshold is for --mode dynamic only (the mode given is 'exit:2')"),
    ("speculative", {"exits": "1"}, "--exits is for --mode dynamic only"),
    ("skip:1", {"adapters": object()}, "--adapters is for --mode exit:K or speculative or dynamic only"),
    ("full", {"adapters": object()}, "--adapters is for --mode exit:K or speculative or dynamic only"),
    ("dynamic", {"draft": "exit:1"}, "--draft is for --mode speculative only"),
])
def test_a_setting_the_mode_does_not_read_is_refused(model, spec, settings, message):
    with pytest.raises(ValueError) as error:
        modes.decoder(spec, model, modes.Settings(**settings))
    assert str(error.value) == message if message.endswith("')") else message in str(error.value)


@pytest.mark.parametrize("spec, message", [
    ("fast", "--mode 'fast' is invalid: allowed: " + ", ".join(m.syntax for m in modes.modes().values())),
    ("full:2", "--mode 'full:2' is invalid"), ("exit", "--mode 'exit' is invalid"), ("exit:", "is invalid"),
    ("exit:5", f"K must be in 1..{LAYERS}"), ("skip:9", "outside 0..3"),
])
def test_bad_specs_are_one_line_errors(spec, message):
    with pytest.raises(ValueError) as error:
        modes.parse(spec, LAYERS)
    assert message in str(error.value)


def test_help_lists_every_mode():
    text = modes.help_lines()
    assert all(m.syntax in text for m in modes.modes().values())

"""Compiled decoding: the same tokens as eager in every mode, the same sampling distribution,
bounded and counted graphs, and the `--compile` switches of `generate` and `speculate run`.

Most tests compile with dynamo's ``eager`` backend (CAPTURE): what torch.compile captures
(the graphs, their guards and recompiles, graph breaks, symbolic shapes) runs as captured.
What inductor then does to a graph first, functionalize it (the cache written in place
becomes a copy back into the inputs) and decompose it, is AOT autograd, which ``aot_eager``
runs without inductor's code generation; it costs about as much as the capture itself, so
one test per kind of graph runs it (test_functionalized_graphs_give_the_eager_tokens), and
one test runs the default inductor backend, as `--compile` does. The models are float64 with a wide init (test_speculative.py's), so two
logits never tie by rounding: a token that differs is a real difference.
"""

from __future__ import annotations

import json
from contextlib import nullcontext

import pytest
import torch

from eval.adapters.exit_adapters import ExitAdapters
from eval.decoding import modes
from eval.decoding.compiled_step import CompiledStep
from eval.decoding.drafts import ExitDraft, SkipDraft
from eval.decoding.sampling import Sampling
from eval.decoding.speculative import SelfSpeculativeDecoder
from eval.decoding.speedup import compare
from framework.config import ModelConfig
from framework.families.registry import build_decoder
from tests.eval.decoding.test_speculative import _chi_square, _critical_value, _joint_second_third, tiny_model
from tests.helpers.in_process import run_main
from tiny_lm import export_tiny_model

PROMPTS = [[3, 9, 4, 1, 7], [5, 2], [8, 8, 1, 30, 2, 6, 11, 4, 2]]
EOS = [25, 11, 47]  # ends some rows early in every mode tested: the batch shrinks as it goes
CAPTURE = "eager"  # dynamo's capture, run as captured (see the module docstring)


@pytest.fixture(scope="module")
def model():
    return tiny_model()


@pytest.fixture(scope="module")
def adapters(model):
    found = ExitAdapters(model.config, [1, 2]).double()
    found.initialise(model, "last")
    return found


def decode(spec: str, model, loaded, prompts, max_new_tokens: int, eos=EOS, **settings):
    if "adapters" in settings:
        settings["adapters"] = loaded
    items, _ = modes.decoder(spec, model, modes.Settings(**settings))(prompts, max_new_tokens, eos_id=eos)
    return [item.tokens for item in items]


@pytest.mark.parametrize("spec,settings", [
    ("full", {}), ("skip:1,2", {}), ("exit:2", {"adapters": True}), ("full", {"sampling": Sampling(temperature=0.8)}),
    ("speculative", {}), ("speculative", {"adapters": True, "draft": "adapter:2", "gamma": 3}),
    ("speculative", {"sampling": Sampling(temperature=0.8), "draft": "skip:1"}),
], ids=lambda value: value if isinstance(value, str) else "+".join(sorted(value)) or "-")
def test_compiled_decoding_gives_the_eager_tokens(model, adapters, spec, settings):
    """A padded batch whose rows end at different steps (EOS: they leave the batch and the
    cache), the shapes changing as it goes: the cache grows, the batch shrinks, a verify
    pass feeds several positions. Sampled, the same tokens too: the fused draft draws each
    row's uniforms in the order the eager loop does (a captured graph computes what eager does)."""
    eager = decode(spec, model, adapters, PROMPTS, 14, **settings)
    with CompiledStep.installed(model, backend=CAPTURE) as compiled:
        got = decode(spec, model, adapters, PROMPTS, 14, **settings)
    assert got == eager
    assert len({len(tokens) for tokens in got}) > 1  # rows ended at different steps
    assert compiled.graphs >= 1 and compiled.eager_fallbacks == 0
    assert compiled.graphs <= 4 * len(compiled.functions)  # bounded: not one graph per token or length
    # greedy: the step with its head and argmax (a speculative round: its γ drafts, its verification) fused
    fused = {key[1] for key in compiled.functions if key[0] == "fused"}
    if spec != "speculative":
        assert fused == {"sampled step" if "sampling" in settings else "greedy step"}
    else:
        assert fused == ({"sampled draft", "verify"} if "sampling" in settings else {"greedy draft", "greedy verify"})
    assert "step" not in model.__dict__  # the eager method is back


@pytest.fixture(scope="module")
def llama():
    torch.manual_seed(0)
    built = build_decoder(ModelConfig(vocab_size=64, d_model=32, n_layers=4, n_heads=4, n_kv_heads=2, max_seq_len=64,
                                      family="llama", bias=False, ffn_hidden=48, attention="sdpa"))
    built.init_weights(std=0.3)
    return built.double().eval()


def test_a_llama_family_model_compiles_without_a_graph_break(llama):
    """RoPE, grouped K/V and SDPA's causal flag (symbolic under dynamic shapes unless the
    family branches on it, which once broke every step's graph into one per block)."""
    same_length = [PROMPTS[0], PROMPTS[0][::-1]]  # no padding: no mask, SDPA's causal flag decides
    eager = decode("speculative", llama, None, same_length, 10)
    with CompiledStep.installed(llama, backend=CAPTURE) as compiled:
        assert decode("speculative", llama, None, same_length, 10) == eager
    assert compiled.summary()["graph_breaks"] == [] and compiled.eager_fallbacks == 0
    assert compiled.graphs <= 4 * len(compiled.functions)


SAMPLED = Sampling(temperature=0.8)
STATIC_CASES = [("celerity", "full", {}), ("celerity", "exit:2", {"adapters": True}),  # adapters: Celerity's fixture
                ("celerity", "speculative", {"adapters": True, "draft": "adapter:2", "gamma": 3}),
                ("celerity", "speculative", {"sampling": SAMPLED, "draft": "skip:1"}),
                ("llama", "full", {}), ("llama", "full", {"sampling": SAMPLED}), ("llama", "speculative", {}),
                ("llama", "speculative", {"sampling": SAMPLED, "draft": "skip:1"})]


@pytest.mark.parametrize("family,spec,settings", STATIC_CASES,
                         ids=lambda value: value if isinstance(value, str) else "+".join(sorted(value)) or "-")
def test_static_shapes_give_the_eager_tokens_with_one_graph_for_every_cache_length(model, llama, adapters, family,
                                                                                   spec, settings):
    """`--compile static` (CUDA graphs' shapes): a fixed-size cache whose length is a tensor.
    The padded batch whose rows leave at EOS gives the eager tokens, with one graph a key for
    every row count above 1 and one for a single row; one prompt decoded to its budget runs
    every step (every speculative round but a cut-short last one, which runs eagerly) through
    one graph a key, whatever the cache length."""
    chosen = model if family == "celerity" else llama
    for prompts, eos, graphs in ((PROMPTS, EOS, {1, 2}), (PROMPTS[:1], None, {1})):
        eager = decode(spec, chosen, adapters, prompts, 14, eos=eos, **settings)
        with CompiledStep.installed(chosen, backend=CAPTURE, static=True) as compiled:
            got = decode(spec, chosen, adapters, prompts, 14, eos=eos, **settings)
        assert got == eager and compiled.eager_fallbacks == 0
        assert all(key[-1] == "static" for key in compiled.functions)
        assert set(compiled.graphs_by_key.values()) <= graphs


@pytest.mark.parametrize("route", ["speculative", "static", "dynamic"])
def test_functionalized_graphs_give_the_eager_tokens(model, llama, adapters, route):
    """Each kind of graph through AOT autograd (aot_eager): a speculative round's fused draft
    and verification writing the cache in place and cropping it, a static cache's fixed-shape
    step with its length a tensor, dynamic exit's steps over the rows still running."""
    if route == "dynamic":
        settings = {"threshold": 0.2, "adapters": adapters}
        eager, _ = dynamic_run(model, settings, False)
        with CompiledStep.installed(model, backend="aot_eager") as compiled:
            got, _ = dynamic_run(model, settings, True)
    else:
        chosen, static = (model, False) if route == "speculative" else (llama, True)
        settings = ({"adapters": True, "draft": "adapter:2", "gamma": 3} if route == "speculative"
                    else {"sampling": SAMPLED, "draft": "skip:1"})
        eager = decode("speculative", chosen, adapters, PROMPTS, 14, **settings)
        with CompiledStep.installed(chosen, backend="aot_eager", static=static) as compiled:
            got = decode("speculative", chosen, adapters, PROMPTS, 14, **settings)
    assert got == eager
    assert compiled.graphs >= 1 and compiled.eager_fallbacks == 0


def test_inductor_the_default_backend_gives_the_eager_tokens(model, adapters):
    eager = decode("exit:3", model, adapters, PROMPTS, 10)
    with CompiledStep.installed(model) as compiled:
        assert decode("exit:3", model, adapters, PROMPTS, 10) == eager
    assert compiled.graphs >= 1 and compiled.compile_seconds > 0


def dynamic_run(model, settings: dict, compiled: bool, max_new_tokens: int = 10, eos_id=EOS):
    context = CompiledStep.installed(model, backend=CAPTURE) if compiled else nullcontext()
    with context as step:
        items, _ = modes.decoder("dynamic", model, modes.Settings(**settings))(PROMPTS, max_new_tokens, eos_id=eos_id)
    return [(item.tokens, item.blocks) for item in items], step


@pytest.mark.parametrize("settings", [{"threshold": 0.2}, {"threshold": 0.2, "adapters": True},
                                      {"threshold": 0.0}, {"threshold": 0.05, "exits": [1, 3]}],
                         ids=["plain", "adapters", "all-leave-first", "two-exits"])
def test_compiled_dynamic_exit_gives_the_eager_tokens_and_exits(model, adapters, settings):
    """Dynamic exit compiled runs a token as steps from one candidate exit to the next (the
    eager one is a single step with an exit rule): the same tokens, the same exit per token
    (the blocks each ran), rows leaving at different exits, every row leaving at the first."""
    settings = dict(settings, adapters=adapters) if "adapters" in settings else settings
    eager, _ = dynamic_run(model, settings, False)
    got, compiled = dynamic_run(model, settings, True)
    assert got == eager
    exits = {cost for _, blocks in eager for cost in blocks}
    assert len(exits) > 1 or settings["threshold"] == 0.0  # tokens left at several depths
    assert compiled.graphs >= 1 and compiled.eager_fallbacks == 0
    assert compiled.graphs <= 4 * len(compiled.functions)
    assert {key[3:] for key in compiled.functions} <= {(False, False), (True, False), (False, True), (True, True)}


def test_compiled_dynamic_exit_propagates_the_state_a_row_left_with(model):
    """Exit 1 alone: blocks 1-3 are one step, in which a row that left must keep its state,
    so that blocks 2 and 3 write its K/V from that state; later tokens that run the whole
    model read them (computing such a row through the blocks changes these tokens)."""
    settings = {"threshold": 0.1, "exits": [1]}
    eager, _ = dynamic_run(model, settings, False, 24, None)
    got, _ = dynamic_run(model, settings, True, 24, None)
    assert got == eager
    assert {cost for _, blocks in eager for cost in blocks} == {1.0, 4.0}


def test_a_fused_sampled_round_draws_what_the_eager_loop_draws(model):
    """Rows with different budgets share fused rounds of γ drafts: each row must draw only for
    the drafts it may use, so its generator ends where the eager loop leaves it."""
    def run(compiled: bool):
        generators = [torch.Generator().manual_seed(seed) for seed in (1, 2, 3)]
        decoder = SelfSpeculativeDecoder(model, SkipDraft((1,)), gamma=3, temperature=0.8)
        with CompiledStep.installed(model, backend=CAPTURE) if compiled else nullcontext():
            items, _ = decoder.generate_batch(PROMPTS, 13, generators=generators)
        return [item.tokens for item in items], [g.get_state() for g in generators]

    (eager, eager_states), (got, states) = run(False), run(True)
    assert got == eager and all(torch.equal(a, b) for a, b in zip(states, eager_states))
    assert len({len(tokens) for tokens in got}) == 1  # no EOS: every row ran to its budget, each at its pace


def test_a_key_past_its_graph_limit_runs_eagerly_and_is_counted(model, adapters):
    eager = decode("full", model, adapters, PROMPTS, 6) + decode("full", model, adapters, PROMPTS[:1], 6)
    with CompiledStep.installed(model, backend=CAPTURE, limit=1) as compiled:
        got = decode("full", model, adapters, PROMPTS, 6) + decode("full", model, adapters, PROMPTS[:1], 6)
    assert got == eager
    assert compiled.eager_fallbacks >= 1 and compiled.summary()["eager_fallbacks"] == compiled.eager_fallbacks


def test_a_fused_function_is_one_graph_and_one_that_breaks_runs_a_compiled_step_per_forward(model):
    def two_steps(forward, token, cache):
        first = forward(token, cache, layers=[0, 1]).hidden
        if fails:
            torch._dynamo.graph_break()
        return first, forward(token, cache, layers=[0, 1]).hidden

    tokens = torch.tensor([PROMPTS[0]])
    for fails in (False, True):
        with torch.inference_mode():  # as decoding runs
            got, expected, cache, compiled = fused_and_eager(model, tokens, two_steps)
        assert all(torch.equal(a, b) for a, b in zip(got, expected)) and cache.length == len(PROMPTS[0]) + 2
        broke = [key for key in compiled.graph_breaks if key[0] == "fused"]
        assert broke == ([("fused", "two steps")] if fails else [])
        # breaking, it ran a compiled step per forward: the plain step's key got its graph
        assert compiled.eager_fallbacks == fails and ((((0, 1), (), 2, False, True) in compiled.functions) == fails)


def fused_and_eager(model, tokens, function):
    cache = model.new_cache(1, 32)
    expected = [model.step(tokens, cache).hidden] + list(function(model.step, tokens[:, -1:], cache))
    cache = model.new_cache(1, 32)
    with CompiledStep.installed(model, backend=CAPTURE) as compiled:
        got = [model.step(tokens, cache).hidden] + list(compiled.fused(("two steps",), function, tokens[:, -1:], cache))
    return got, expected, cache, compiled


def test_training_and_measurement_calls_stay_eager(model):
    tokens = torch.tensor([PROMPTS[0]])
    expected = model(tokens)
    with CompiledStep.installed(model, backend=CAPTURE) as compiled:
        assert torch.equal(model(tokens), expected)  # no cache: the eager method
    assert compiled.graphs == 0 and not compiled.functions


def test_compiled_speculative_sampling_keeps_the_full_models_distribution():
    """test_speculative.py's batched χ² test through compiled steps: (t2, t3) of 3000 rows
    against the full model's exact joint, and far from the draft's."""
    model = tiny_model(vocab=8, layers=2, d=16, std=0.6, seed=3)
    prompt = [1, 5, 2]
    exact, drafty = _joint_second_third(model, torch.tensor(prompt), None), \
        _joint_second_third(model, torch.tensor(prompt), (1,))
    runs = 3000
    decoder = SelfSpeculativeDecoder(model, SkipDraft((1,)), gamma=2, temperature=1.0, seed=0, seed_by="position")
    with CompiledStep.installed(model, backend=CAPTURE) as compiled:
        items, stats = decoder.generate_batch([prompt] * runs, 4)
    assert compiled.graphs >= 2
    counts = torch.zeros(8, 8)
    for item in items:
        counts[item.tokens[1], item.tokens[2]] += 1
    assert stats.drafted - stats.accepted > runs // 10
    stat, dof = _chi_square(counts, exact)
    assert stat < _critical_value(dof), f"χ²={stat:.1f} on {dof} dof against the full model"
    stat_draft, dof_draft = _chi_square(counts, drafty)
    assert stat_draft > _critical_value(dof_draft)


def test_compare_with_compile_reports_its_graphs_and_puts_the_method_back(model):
    with CompiledStep.installed(model, backend=CAPTURE) as outer:
        report = compare(model, ExitDraft(2), PROMPTS, max_new_tokens=8, repeats=1, compile=True)
        assert model.__dict__["step"] is outer  # an installed one is used and stays
    assert report["identical_to_greedy"] is True
    assert report["compiled"]["graphs"] == outer.graphs >= 2
    plain = compare(model, ExitDraft(2), PROMPTS, max_new_tokens=8, repeats=1)
    assert plain["compiled"] is None and plain["outputs"] == report["outputs"]
    with pytest.raises(ValueError, match=r"warmup=0 is invalid with compile"):
        compare(model, ExitDraft(2), PROMPTS, max_new_tokens=8, repeats=1, warmup=0, compile=True)


@pytest.mark.parametrize("shapes", [[], ["static"]], ids=["auto", "static"])
def test_generate_compile_gives_the_eager_text_and_states_its_compile_time(tmp_path, capsys, shapes):
    from eval.decoding.generate import main

    folder = export_tiny_model(tmp_path / "model", seed=5)
    args = ["--ckpt", str(folder), "--prompt", "The sun rises in the", "--max-new-tokens", "6", "--no-echo",
            "--mode", "exit:2"]
    code, eager = run_main(main, args, capsys)
    assert code == 0
    code, compiled = run_main(main, [*args, "--compile", *shapes, "--stats", str(tmp_path / "stats.json")], capsys)
    assert code == 0 and compiled.out == eager.out
    assert "compiled: " in compiled.err and " s (included)" in compiled.err
    stats = json.loads((tmp_path / "stats.json").read_text())
    assert stats["compiled"]["graphs"] >= 1 and stats["compiled"]["compile_seconds"] > 0
    if shapes:
        code, refused = run_main(main, [*args, "--compile", "fixed"], capsys)
        assert code == 2 and "argument --compile: invalid choice: 'fixed'" in refused.err


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("spec", ["full", "speculative"])
def test_static_shapes_on_a_gpu_record_cuda_graphs_and_give_the_eager_tokens(spec):
    from torch._dynamo.utils import counters

    gpu = tiny_model().float().cuda()
    eager = decode(spec, gpu, None, PROMPTS, 12)
    counters.clear()
    with CompiledStep.installed(gpu) as compiled:
        assert compiled.static  # a GPU's default
        got = decode(spec, gpu, None, PROMPTS, 12)
    assert got == eager and compiled.eager_fallbacks == 0
    assert counters["inductor"]["cudagraph_skips"] == 0  # every graph recorded as a CUDA graph


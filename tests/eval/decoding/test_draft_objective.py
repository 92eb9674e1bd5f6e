"""eval/decoding/draft_objective.py: the replayed rounds, the cost model and the
teacher-forced acceptance against real decoding."""

from __future__ import annotations

import pytest
import torch

from eval.decoding.draft_objective import CalibrationObjective, DraftCosts, replay_rounds
from eval.decoding.drafts import ExitDraft
from eval.decoding.speculative import SelfSpeculativeDecoder
from tests.helpers.tiny_decoder import tiny_decoder


def test_replay_rounds_by_hand():
    # token 0 comes from the prefill; the draft gets tokens 2 and 5 wrong
    agree = [False, True, False, True, True, False, True]
    # round 1 drafts 1, 2: keeps 1, the verifier corrects 2; round 2 drafts 3, 4, both
    # kept, the verifier adds 5; round 3 has room for the verifier's token 6 only
    assert replay_rounds(agree, gamma=2) == [(2, 1), (2, 2), (0, 0)]
    assert replay_rounds([False] * 4, gamma=5) == [(2, 0), (1, 0), (0, 0)]


def test_layer_cost_model():
    costs = DraftCosts.from_layers(gamma=3)
    assert costs.draft(2, 8) == pytest.approx(0.25)
    assert costs.verify == [1.0] * 4


@pytest.fixture(scope="module")
def model():
    return tiny_decoder(0, 4, 96, vocab_size=48, n_heads=2, std=0.3, multipliers=False, double=True)


@pytest.fixture(scope="module")
def prompts():
    gen = torch.Generator().manual_seed(2)
    return [torch.randint(0, 48, (6,), generator=gen) for _ in range(5)]


@pytest.mark.parametrize("exit_layer", [1, 3])
def test_teacher_forced_replay_matches_real_decoding_for_an_exit_draft(model, prompts, exit_layer):
    """An early-exit draft's layers are the full model's own, so its teacher-forced
    predictions are exactly what it drafts in decoding: the replay must agree."""
    gamma, new_tokens = 3, 24
    objective = CalibrationObjective(model, prompts, new_tokens=new_tokens, gamma=gamma)
    with torch.inference_mode():
        logits = model(objective.sequences[:, :-1], exit_layer=exit_layer)
    agree = objective.agreement(exit_layer=exit_layer)
    assert torch.equal(agree, logits[:, len(prompts[0]) - 1:].argmax(-1) == objective.continuations)
    for prompt, row in zip(prompts, agree.tolist()):
        rounds = replay_rounds(row, gamma)
        _, stats = SelfSpeculativeDecoder(model, ExitDraft(exit_layer), gamma=gamma).generate(prompt, new_tokens)
        assert (stats.rounds, stats.drafted, stats.accepted) == (
            len(rounds), sum(k for k, _ in rounds), sum(a for _, a in rounds))


def test_agreement_resumed_from_the_prefix_equals_a_plain_skip_forward(model, prompts):
    objective = CalibrationObjective(model, prompts, new_tokens=10, gamma=3)
    for skip in [(), (0,), (2,), (1, 3), (0, 1, 2)]:
        with torch.inference_mode():
            logits = model(objective.sequences[:, :-1], skip_layers=skip)
        direct = logits[:, len(prompts[0]) - 1:].argmax(-1) == objective.continuations
        assert torch.equal(objective.agreement(skip), direct), skip


def test_objective_of_the_full_model_accepts_everything(model, prompts):
    objective = CalibrationObjective(model, prompts, new_tokens=16, gamma=4)
    full = objective.estimate(())
    assert full["acceptance"] == 1.0
    assert full["speedup"] == pytest.approx(1.0)  # 5 tokens per round for 4 full drafts + 1 verify
    assert objective.estimate((0, 1, 2))["draft_cost"] == pytest.approx(0.25)


def test_measured_costs_are_the_fastest_runs_relative_to_one_full_step(model, monkeypatch):
    """A fake clock charges each forward 1 + 0.5 per extra token (times 0.2 with no block
    run) and slows the first two runs down: the costs must be those charges, relative.
    The forwards timed are the ones a skip draft runs (Decoder.step), not another path."""
    import eval.decoding.draft_objective as search_module

    clock = {"now": 0.0, "calls": 0}
    step = model.step

    def charged(inputs, cache=None, **kwargs):
        tokens = inputs.shape[1]
        if tokens < 8:  # not the context fill
            clock["calls"] += 1
            slow = 3.0 if clock["calls"] <= 2 * 5 else 1.0  # the untimed warm-up runs: 5 shapes, 2 runs
            blocks = 0.2 if kwargs.get("layers") is not None and len(kwargs["layers"]) == 0 else 1.0
            clock["now"] += slow * blocks * (1.0 + 0.5 * (tokens - 1))
        return step(inputs, cache, **kwargs)

    monkeypatch.setattr(model, "step", charged)
    monkeypatch.setattr(search_module.time, "perf_counter", lambda: clock["now"])
    costs = DraftCosts.measure(model, context=8, gamma=2, repeats=3)
    assert costs.empty == pytest.approx(0.2)
    assert costs.verify == pytest.approx([1.0, 1.5, 2.0])
    assert clock["calls"] == 5 * 5  # every shape, every run, through step


def test_calibration_prompts_may_differ_in_length(model, prompts):
    """Left-padded calibration gives every prompt the agreement it has alone."""
    mixed = [prompts[0][:2], prompts[1], prompts[2][:4]]
    together = CalibrationObjective(model, mixed, new_tokens=10, gamma=3)
    for skip in [(), (1,), (0, 2)]:
        rows = together.agreement(skip)
        for row, prompt in zip(rows, mixed):
            assert torch.equal(row, CalibrationObjective(model, [prompt], new_tokens=10, gamma=3).agreement(skip)[0])

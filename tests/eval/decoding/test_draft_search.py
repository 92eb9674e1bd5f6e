"""Draft skip-set search: the methods, the budget, the cheap objective, the CLI."""

from __future__ import annotations

import copy
import itertools
import json

import pytest
import torch

from eval.decoding.draft_search import (METHODS, BudgetedObjective, BudgetExhausted, CalibrationObjective, DraftCosts, main,
                         replay_rounds, run_search, skip_set)
from eval.decoding.drafts import ExitDraft
from eval.decoding.speculative import SelfSpeculativeDecoder
from framework.checkpoint import export_decoder
from framework.config import ModelConfig
from framework.model.decoder import Decoder
from tests.helpers.checkpoint_run import count_checkpoint_opens


L = 8
# A speedup-shaped synthetic objective: skipping a layer saves its cost, but the
# "important" layers cut acceptance (0, 5, 7 hard), and layers 2 and 3 hurt together.
IMPORTANT = {0: 0.5, 2: 0.99, 5: 0.45, 7: 0.6}


def synthetic(mask: tuple[bool, ...]) -> float:
    skipped = set(skip_set(mask))
    acceptance = 0.97 ** len(skipped)
    for layer, factor in IMPORTANT.items():
        if layer in skipped:
            acceptance *= factor
    if {2, 3} <= skipped:
        acceptance *= 0.5
    cost = 0.1 + 0.9 * (L - len(skipped)) / L
    gamma = 5
    tokens = (1 - acceptance ** (gamma + 1)) / (1 - acceptance) if acceptance < 1 else gamma + 1
    return tokens / (gamma * cost + 1)


def brute_force_best() -> tuple[int, ...]:
    masks = list(itertools.product([False, True], repeat=L))
    return skip_set(max(masks, key=synthetic))


@pytest.mark.parametrize("method", METHODS)
def test_each_method_finds_the_known_best_set_within_budget(method):
    best = brute_force_best()
    assert best == (1, 3, 4, 6)  # unique: (1, 2, 4, 6) is 1% worse
    calls = []

    def counted(mask):
        calls.append(mask)
        return synthetic(mask)

    result = run_search(counted, L, methods=[method], budget=60, seed=0)[method]
    assert tuple(result["skip_layers"]) == best
    assert result["evaluations"] <= 60
    assert len(calls) == len(set(calls)) <= 60  # every call a distinct set, never past the budget
    assert result["evaluations_to_within_5pct"] is not None
    assert result["best_so_far"] == sorted(result["best_so_far"])


def test_budget_is_a_hard_limit_and_revisits_are_free():
    objective = BudgetedObjective(synthetic, budget=3)
    a, b, c, d = [tuple(i == j for j in range(L)) for i in range(4)]
    for mask in (a, b, a, c, a, b):
        objective(mask)
    assert objective.remaining == 0 and len(objective.best_so_far) == 3
    with pytest.raises(BudgetExhausted):
        objective(d)


def test_methods_stop_at_a_small_budget():
    results = run_search(synthetic, L, budget=5, seed=1)
    assert set(results) == set(METHODS)
    assert all(r["evaluations"] <= 5 for r in results.values())


@pytest.mark.parametrize("methods,budget,message", [
    (["bayesian", "grid"], 10, "methods=.* is invalid"),
    ([], 10, "methods=.* is invalid"),
    (["genetic"], 0, "budget=0 is invalid"),
])
def test_bad_search_arguments(methods, budget, message):
    with pytest.raises(ValueError, match=message):
        run_search(synthetic, L, methods=methods, budget=budget)


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


# ------------------------------------------------------------- objective on a model


def tiny_model() -> Decoder:
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=48, d_model=32, n_layers=4, n_heads=2, max_seq_len=96, attention="sdpa")
    model = Decoder(cfg)
    model.init_weights(std=0.3)
    return model.double().eval()


@pytest.fixture(scope="module")
def model():
    return tiny_model()


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
    import eval.decoding.draft_search as search_module

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


# ------------------------------------------------------------------------- CLI


@pytest.fixture(scope="module")
def exported(tmp_path_factory, model, prompts):
    root = tmp_path_factory.mktemp("search")
    export_decoder(copy.deepcopy(model).float(), root / "model")
    (root / "prompts.json").write_text(json.dumps([p.tolist() for p in prompts]))
    return root


def test_cli_search_reports_every_method(exported, model, prompts, capsys, monkeypatch):
    out = exported / "search.json"
    opened = count_checkpoint_opens(monkeypatch)
    code = main(["--ckpt", str(exported / "model"), "--prompts", str(exported / "prompts.json"),
                 "--calibration-prompts", "3", "--confirm-prompts", "2", "--budget", "6",
                 "--cost", "layers", "--max-new-tokens", "12", "--repeats", "1", "--out", str(out)])
    assert code == 0 and opened == [exported / "model"]  # opened and proven once for the whole command
    report = json.loads(out.read_text())
    assert set(report["methods"]) == set(METHODS)
    reference = CalibrationObjective(model, prompts[:3], new_tokens=12, gamma=5)  # the same objective, anew
    for r in report["methods"].values():
        assert r["evaluations"] <= 6
        estimate = reference.estimate(r["skip_layers"])
        assert r["estimated_speedup"] == pytest.approx(estimate["speedup"])
        assert r["estimated_acceptance"] == pytest.approx(estimate["acceptance"])
        assert r["identical_to_greedy"] is True
    best = report["best"]
    assert best["speedup"] == max(r["measured_speedup"] for r in report["methods"].values())
    assert best["skip_layers"] == report["methods"][best["method"]]["skip_layers"]
    assert report["exit_draft_estimates"] == {str(e): pytest.approx(reference.estimate(exit_layer=e))
                                              for e in (1, 2, 3)}
    assert "best:" in capsys.readouterr().out


def test_calibration_prompts_may_differ_in_length(model, prompts):
    """Left-padded calibration gives every prompt the agreement it has alone."""
    mixed = [prompts[0][:2], prompts[1], prompts[2][:4]]
    together = CalibrationObjective(model, mixed, new_tokens=10, gamma=3)
    for skip in [(), (1,), (0, 2)]:
        rows = together.agreement(skip)
        for row, prompt in zip(rows, mixed):
            assert torch.equal(row, CalibrationObjective(model, [prompt], new_tokens=10, gamma=3).agreement(skip)[0])


@pytest.mark.parametrize("args,message", [
    (["--methods", "bayesian,random"], "--methods 'bayesian,random' is invalid"),
    (["--budget", "0"], "--budget=0 is invalid"),
    (["--ckpt", "/missing/model"], "does not exist"),
    (["--confirm-prompts", "4"], "5 prompts are too few"),
])
def test_cli_search_errors(exported, capsys, args, message):
    base = ["--ckpt", str(exported / "model"), "--prompts", str(exported / "prompts.json"),
            "--calibration-prompts", "3", "--out", str(exported / "never.json")]
    with pytest.raises(SystemExit) as exit_info:
        main(base + args)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err

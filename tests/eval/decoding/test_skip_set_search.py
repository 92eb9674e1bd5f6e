"""eval/decoding/skip_set_search.py: the four searches, the budget, the registry (on a
synthetic objective whose best set is known by brute force)."""

from __future__ import annotations

import itertools

import pytest

from eval.decoding.skip_set_search import METHODS, BudgetedObjective, BudgetExhausted, run_search, skip_set


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

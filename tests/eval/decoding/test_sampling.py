"""Choosing tokens: the filtered distributions by hand, the draws against their law."""

from __future__ import annotations

import math

import pytest
import torch

from eval.decoding.sampling import Sampling, draw, row_generators, uniforms


def test_greedy_is_the_argmax():
    logits = torch.tensor([[0.1, 2.0, -1.0], [3.0, 0.0, 2.9]])
    tokens, probs = Sampling().choose(logits, row_generators(0, [0, 1]))
    assert tokens.tolist() == [1, 0] and probs is None


def test_temperature_top_k_and_top_p_by_hand():
    logits = torch.log(torch.tensor([[0.5, 0.25, 0.15, 0.1]]))
    plain = Sampling(temperature=1.0).probabilities(logits)
    assert plain[0].tolist() == pytest.approx([0.5, 0.25, 0.15, 0.1])
    hot = Sampling(temperature=2.0).probabilities(logits)[0]
    root = torch.tensor([0.5, 0.25, 0.15, 0.1]).sqrt()
    assert hot.tolist() == pytest.approx((root / root.sum()).tolist())
    top2 = Sampling(temperature=1.0, top_k=2).probabilities(logits)[0]
    assert top2.tolist() == pytest.approx([2 / 3, 1 / 3, 0.0, 0.0])
    # top_p 0.7: 0.5 alone is short of it, 0.5 + 0.25 reaches it: the nucleus is two tokens.
    nucleus = Sampling(temperature=1.0, top_p=0.7).probabilities(logits)[0]
    assert nucleus.tolist() == pytest.approx([2 / 3, 1 / 3, 0.0, 0.0])
    assert Sampling(temperature=1.0, top_p=0.5).probabilities(logits)[0].tolist() == pytest.approx([1, 0, 0, 0])


def test_draws_follow_the_distribution():
    probs = torch.tensor([[0.0, 0.2, 0.5, 0.0, 0.3]])
    generators = row_generators(3, [0])
    counts = torch.zeros(5)
    for _ in range(4000):
        counts[int(draw(probs, uniforms(generators))[0])] += 1
    expected = probs[0] * 4000
    assert counts[0] == counts[3] == 0  # no mass, never drawn
    stat = float(((counts - expected)[expected > 0] ** 2 / expected[expected > 0]).sum())
    assert stat < 18.5  # χ²(2) upper 1e-4 quantile
    assert int(draw(probs, torch.tensor([1.0 - 1e-17], dtype=torch.float64))[0]) == 4  # never past the last mass


def test_each_row_has_its_own_reproducible_stream():
    a = uniforms(row_generators(5, [0, 1, 2]))
    b = uniforms(row_generators(5, [2]))
    assert a[2] == b[0] and len(set(a.tolist())) == 3
    assert uniforms(row_generators(6, [0]))[0] != a[0]


@pytest.mark.parametrize("kwargs, message", [
    ({"temperature": -1.0}, "temperature=-1.0 is invalid"),
    ({"temperature": 1.0, "top_k": 0}, "top_k=0 is invalid"),
    ({"temperature": 1.0, "top_p": 0.0}, "top_p=0.0 is invalid"),
    ({"temperature": 1.0, "top_p": 1.2}, "top_p=1.2 is invalid"),
    ({"top_k": 5}, "give a temperature > 0"),
])
def test_bad_settings_are_one_line_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Sampling(**kwargs)


def test_sampling_at_high_temperature_spreads_out():
    logits = torch.log(torch.tensor([[0.9, 0.05, 0.05]]))
    cold = Sampling(temperature=0.25).probabilities(logits)[0]
    warm = Sampling(temperature=4.0).probabilities(logits)[0]
    assert cold[0] > 0.99 and abs(float(warm[0]) - 1 / 3) < 0.2
    assert math.isclose(float(warm.sum()), 1.0, rel_tol=1e-6)

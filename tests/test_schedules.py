import math

import pytest

from framework.config import LayerDropoutConfig
from framework.schedules import (
    DISTRIBUTIONS,
    TIME_SCHEDULES,
    dropout_rates,
    effective_depth,
    layer_distribution,
    mean_dropout,
    mean_time_factor,
    time_factor,
)

LAYERS = (1, 2, 3, 4, 7, 13, 52)
STEPS = (2, 3, 10, 101, 1000)


def config(distribution="increasing", schedule="constant", p_max=0.4):
    return LayerDropoutConfig(p_max=p_max, distribution=distribution, schedule=schedule)


def brute_force_mean(cfg, num_layers, total_steps):
    """The definition of P̄: a plain loop over every step and every layer."""
    total = 0.0
    for step in range(total_steps):
        total += sum(dropout_rates(cfg, num_layers, step, total_steps))
    return total / (num_layers * total_steps)


# --- depth distributions -------------------------------------------------------------

def test_distributions_match_the_paper_formulas():
    assert layer_distribution(config("uniform"), 4) == [0.4] * 4
    assert layer_distribution(config("increasing"), 5) == pytest.approx([0, 0.1, 0.2, 0.3, 0.4])
    assert layer_distribution(config("alternating"), 5) == [0, 0.4, 0, 0.4, 0]
    explicit = LayerDropoutConfig(distribution=[0.0, 0.25, 0.5])
    assert layer_distribution(explicit, 3) == [0.0, 0.25, 0.5]


@pytest.mark.parametrize("num_layers", [n for n in LAYERS if n > 1])
def test_increasing_distribution_spans_zero_to_p_max_with_mean_half(num_layers):
    rates = layer_distribution(config("increasing", p_max=0.6), num_layers)
    assert rates[0] == 0.0 and rates[-1] == pytest.approx(0.6)
    assert all(b > a for a, b in zip(rates, rates[1:]))
    assert sum(rates) / num_layers == pytest.approx(0.3, abs=1e-12)


@pytest.mark.parametrize("num_layers", LAYERS)
def test_alternating_mean_is_floor_half_over_layers(num_layers):
    rates = layer_distribution(config("alternating", p_max=0.5), num_layers)
    assert sum(rates) / num_layers == pytest.approx((num_layers // 2) / num_layers * 0.5)


def test_single_layer_distributions():
    # ILD keeps its first layer, and with L = 1 the only layer is the first one.
    assert layer_distribution(config("increasing"), 1) == [0.0]
    assert layer_distribution(config("alternating"), 1) == [0.0]
    assert layer_distribution(config("uniform"), 1) == [0.4]


@pytest.mark.parametrize("distribution", ["uniform", "increasing", "alternating"])
def test_p_max_zero_is_dense(distribution):
    cfg = config(distribution, "decreasing", p_max=0.0)
    assert dropout_rates(cfg, 6, 0, 10) == [0.0] * 6
    assert mean_dropout(cfg, 6, 10) == 0.0
    assert effective_depth(cfg, 6, 3, 10) == 6.0


# --- time schedules ------------------------------------------------------------------

@pytest.mark.parametrize("total_steps", STEPS)
def test_time_factor_endpoints(total_steps):
    last = total_steps - 1
    assert time_factor("constant", 0, total_steps) == time_factor("constant", last, total_steps) == 1
    assert time_factor("increasing", 0, total_steps) == 0.0
    assert time_factor("increasing", last, total_steps) == 1.0
    assert time_factor("decreasing", 0, total_steps) == 1.0
    assert time_factor("decreasing", last, total_steps) == 0.0


def test_time_factor_is_linear_in_the_step():
    assert time_factor("increasing", 25, 101) == pytest.approx(0.25)
    assert time_factor("decreasing", 25, 101) == pytest.approx(0.75)


def test_single_step_run_takes_the_t0_value():
    assert time_factor("increasing", 0, 1) == 0.0
    assert time_factor("decreasing", 0, 1) == 1.0
    assert time_factor("constant", 0, 1) == 1.0
    cfg = config("uniform", "decreasing", p_max=0.3)
    assert mean_dropout(cfg, 4, 1) == pytest.approx(0.3)
    assert mean_dropout(config("uniform", "increasing"), 4, 1) == 0.0


def test_rates_combine_depth_and_time():
    cfg = config("increasing", "decreasing", p_max=0.4)
    assert dropout_rates(cfg, 5, 0, 11) == pytest.approx([0, 0.1, 0.2, 0.3, 0.4])
    assert dropout_rates(cfg, 5, 5, 11) == pytest.approx([0, 0.05, 0.1, 0.15, 0.2])
    assert dropout_rates(cfg, 5, 10, 11) == pytest.approx([0.0] * 5)


# --- P̄ closed forms (exact because t/(T-1) averages 1/2 over t = 0..T-1) --------------

@pytest.mark.parametrize("num_layers", [n for n in LAYERS if n > 1])
@pytest.mark.parametrize("total_steps", STEPS)
def test_closed_forms_of_mean_dropout(num_layers, total_steps):
    p_max = 0.5
    assert mean_dropout(config("increasing", "constant", p_max), num_layers,
                        total_steps) == pytest.approx(p_max / 2)
    assert mean_dropout(config("increasing", "decreasing", p_max), num_layers,
                        total_steps) == pytest.approx(p_max / 4)
    assert mean_dropout(config("increasing", "increasing", p_max), num_layers,
                        total_steps) == pytest.approx(p_max / 4)
    assert mean_dropout(config("uniform", "increasing", p_max), num_layers,
                        total_steps) == pytest.approx(p_max / 2)
    assert mean_dropout(config("alternating", "constant", p_max), num_layers,
                        total_steps) == pytest.approx((num_layers // 2) / num_layers * p_max)


@pytest.mark.parametrize("distribution", ["uniform", "increasing", "alternating",
                                          [0.0, 0.3, 0.1, 0.5, 0.2, 0.0, 0.9]])
@pytest.mark.parametrize("schedule", ["constant", "increasing", "decreasing"])
@pytest.mark.parametrize("total_steps", [1, 2, 7, 250])
def test_mean_dropout_equals_brute_force_loop(distribution, schedule, total_steps):
    if isinstance(distribution, list):
        cfg = LayerDropoutConfig(distribution=distribution, schedule=schedule)
    else:
        cfg = config(distribution, schedule, p_max=0.45)
    assert mean_dropout(cfg, 7, total_steps) == pytest.approx(
        brute_force_mean(cfg, 7, total_steps), rel=1e-12, abs=1e-15)


def test_mean_dropout_of_the_largest_recipe_is_exact():
    # 385,285 steps (recipes/8.2b.yaml): summed step by step, still the closed form.
    cfg = config("increasing", "decreasing", p_max=0.99)
    assert mean_dropout(cfg, 52, 385_285) == pytest.approx(0.99 / 4, rel=1e-12)


def test_effective_depth_is_layers_minus_summed_rates():
    cfg = config("increasing", "decreasing", p_max=0.4)
    assert effective_depth(cfg, 5, 0, 11) == pytest.approx(5 - 1.0)
    assert effective_depth(cfg, 5, 10, 11) == 5.0
    rates = dropout_rates(cfg, 5, 3, 11)
    assert effective_depth(cfg, 5, 3, 11) == pytest.approx(sum(1 - p for p in rates))


# --- the registries -------------------------------------------------------------------

@pytest.mark.parametrize("name", list(DISTRIBUTIONS))
@pytest.mark.parametrize("num_layers", LAYERS)
def test_every_distribution_gives_one_rate_in_range_per_layer(name, num_layers):
    rates = DISTRIBUTIONS[name](0.9, num_layers)
    assert len(rates) == num_layers and all(0.0 <= p <= 0.9 for p in rates)
    assert DISTRIBUTIONS[name](0.0, num_layers) == [0.0] * num_layers


@pytest.mark.parametrize("name", list(TIME_SCHEDULES))
@pytest.mark.parametrize("total_steps", [1, 2, 7, 100])
def test_every_schedule_stays_in_the_unit_interval(name, total_steps):
    assert all(0.0 <= time_factor(name, step, total_steps) <= 1.0 for step in range(total_steps))
    assert mean_time_factor(name, total_steps) == pytest.approx(
        sum(time_factor(name, t, total_steps) for t in range(total_steps)) / total_steps)


def test_a_registered_schedule_gets_its_mean_without_a_closed_form(monkeypatch):
    """What adding a schedule takes: a function in TIME_SCHEDULES; P̄ follows from it."""
    monkeypatch.setitem(TIME_SCHEDULES, "half-turn", lambda t, total: 0.5 * (1 + math.cos(math.pi * t / total)))
    assert mean_time_factor("half-turn", 1000) == pytest.approx(0.5 + 0.5 / 1000)  # Σ cos over a half turn = 1

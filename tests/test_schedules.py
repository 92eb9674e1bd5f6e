import math

import pytest

from framework.config import LayerDropoutConfig
from framework.schedules import (
    dropout_rates,
    effective_depth,
    layer_distribution,
    mean_dropout,
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
    assert layer_distribution(config([0.0, 0.25, 0.5]), 3) == [0.0, 0.25, 0.5]


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
    cfg = config(distribution, schedule, p_max=0.45)
    assert mean_dropout(cfg, 7, total_steps) == pytest.approx(
        brute_force_mean(cfg, 7, total_steps), rel=1e-12, abs=1e-15)


def test_mean_dropout_of_a_huge_run_needs_no_loop():
    cfg = config("increasing", "decreasing", p_max=0.8)
    assert mean_dropout(cfg, 40, 10**12) == pytest.approx(0.2)


def test_effective_depth_is_layers_minus_summed_rates():
    cfg = config("increasing", "decreasing", p_max=0.4)
    assert effective_depth(cfg, 5, 0, 11) == pytest.approx(5 - 1.0)
    assert effective_depth(cfg, 5, 10, 11) == 5.0
    rates = dropout_rates(cfg, 5, 3, 11)
    assert effective_depth(cfg, 5, 3, 11) == pytest.approx(sum(1 - p for p in rates))


# --- invalid input -------------------------------------------------------------------

@pytest.mark.parametrize("p_max", [-0.1, 1.0, 1.5, math.nan])
def test_p_max_outside_unit_interval_is_rejected(p_max):
    with pytest.raises(ValueError, match="p_max"):
        config(p_max=p_max)


def test_p_max_mutated_after_construction_is_rejected():
    cfg = config()
    cfg.p_max = 1.2
    with pytest.raises(ValueError, match=r"p_max=1\.2.*\[0, 1\)"):
        dropout_rates(cfg, 4, 0, 10)


def test_unknown_names_are_rejected():
    with pytest.raises(ValueError, match="distribution='linear'.*uniform, increasing"):
        config(distribution="linear")
    with pytest.raises(ValueError, match="schedule='cosine'.*constant, increasing, decreasing"):
        config(schedule="cosine")
    with pytest.raises(ValueError, match="schedule='cosine'"):
        time_factor("cosine", 0, 10)
    cfg = config()
    cfg.distribution = "linear"
    with pytest.raises(ValueError, match="distribution='linear'"):
        layer_distribution(cfg, 4)


def test_explicit_list_of_wrong_length_is_rejected():
    with pytest.raises(ValueError, match=r"distribution=.*one rate per layer \(4\)"):
        dropout_rates(config([0.1, 0.2, 0.3]), 4, 0, 10)


@pytest.mark.parametrize("rate", [1.0, 1.2, -0.1])
def test_explicit_rate_outside_unit_interval_is_rejected(rate):
    with pytest.raises(ValueError, match=r"distribution=.*\[0, 1\)"):
        config([0.1, rate])


@pytest.mark.parametrize("total_steps", [0, -5, 2.5, True])
def test_non_positive_total_steps_is_rejected(total_steps):
    with pytest.raises(ValueError, match="total_steps"):
        dropout_rates(config(), 4, 0, total_steps)
    with pytest.raises(ValueError, match="total_steps"):
        mean_dropout(config(), 4, total_steps)


@pytest.mark.parametrize("step", [-1, 10, 11, 1.0])
def test_step_outside_the_run_is_rejected(step):
    with pytest.raises(ValueError, match=rf"step={step!r}.*\[0, 9\]"):
        time_factor("constant", step, 10)


@pytest.mark.parametrize("num_layers", [0, -1, 2.0])
def test_non_positive_layer_count_is_rejected(num_layers):
    with pytest.raises(ValueError, match="num_layers"):
        layer_distribution(config(), num_layers)

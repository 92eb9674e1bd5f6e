"""The report's statistics by hand: Student t, the paired and unpaired noise, Holm."""

import math
import statistics

import pytest

from eval.experiments.report.significance import (Noise, block_residual_std, critical_t, difference, f_upper_p, holm,
                                                  noise_of, seed_gaps, seeds_beyond, t_two_sided_p, unstable_spread,
                                                  verdict_of, without_flagged)


def test_student_t_matches_its_closed_forms_and_scipy():
    for t in (0.3, 1.0, 2.5, 19.0):
        assert t_two_sided_p(t, 1) == pytest.approx(1 - 2 / math.pi * math.atan(t))  # Cauchy
        assert t_two_sided_p(t, 2) == pytest.approx(1 - t / math.sqrt(t * t + 2))
    assert t_two_sided_p(1.959964, 1e9) == pytest.approx(0.05, abs=1e-6)  # the normal limit
    assert critical_t(1) == pytest.approx(math.tan(math.pi * 0.475))  # 12.706
    assert critical_t(2) == pytest.approx(math.sqrt(2 / (1 - 0.95 ** 2) - 2))  # 4.303
    stats = pytest.importorskip("scipy.stats")
    for t, dof in ((0.5, 3.7), (2.2, 13), (4.0, 7.5), (30.0, 2)):
        assert t_two_sided_p(t, dof) == pytest.approx(2 * stats.t.sf(t, dof), rel=1e-10)
    assert critical_t(13) == pytest.approx(stats.t.ppf(0.975, 13))


def test_holm_by_hand():
    # sorted 0.005, 0.01, 0.03, 0.04 times 4, 3, 2, 1 = 0.02, 0.03, 0.06, 0.04 -> monotone: 0.06 for the last
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])
    assert holm([]) == []


def test_the_paired_noise_is_the_residual_of_configuration_plus_seed():
    # 3 configurations × 2 seeds: σ² = Σ(δ_i − δ̄)²/(2(k − 1)), δ_i the seed-1 minus seed-0 step
    a, b, c = {0: 3.00, 1: 3.02}, {0: 2.90, 1: 2.93}, {0: 3.02, 1: 3.03}
    sigma, dof = block_residual_std([a, b, c])
    assert dof == 2 and sigma == pytest.approx(math.sqrt(statistics.variance([0.02, 0.03, 0.01]) / 2))
    # a configuration at one seed, or a seed only one configuration has, fits exactly: it adds nothing
    assert block_residual_std([a, b, c, {0: 9.0}, {7: 1.0}]) == (pytest.approx(sigma), 2)
    # a seed effect common to every configuration is no noise
    assert block_residual_std([{0: 1.0, 1: 2.0}, {0: 5.0, 1: 6.0}])[0] == pytest.approx(0.0, abs=1e-12)


def test_paired_and_unpaired_differences_by_hand():
    noise = Noise(within=0.02, within_dof=10, residual=0.01, residual_dof=6)
    paired = difference({0: 2.9, 1: 2.95, 2: 3.5}, {0: 3.0, 1: 3.0}, noise)
    assert paired.paired == 2 and paired.diff == pytest.approx(-0.075)  # seed 2 has no partner
    assert paired.se == pytest.approx(0.01) and paired.dof == 6 and paired.reference == pytest.approx(3.0)
    assert paired.p_value == pytest.approx(t_two_sided_p(7.5, 6))
    unpaired = difference({0: 2.9}, {1: 3.0, 2: 3.1}, noise, eval_se=0.003)
    assert unpaired.paired == 0 and unpaired.diff == pytest.approx(-0.15) and unpaired.dof == 10
    assert unpaired.se == pytest.approx(math.sqrt(0.02 ** 2 * (1 + 1 / 2) + 0.003 ** 2))
    # no seed noise: the paired evaluation error alone decides nothing
    alone = difference({0: 4.81}, {0: 4.71}, Noise(None, 0, None, 0), eval_se=0.003)
    assert alone.p_value is None and verdict_of(alone.p_value, alone.diff) == "no noise estimate"
    assert verdict_of(0.01, -1) == "better" and verdict_of(0.01, 1) == "worse" and verdict_of(0.2, 1) == "within noise"


def test_the_own_optimum_rule_pairs_only_the_very_same_seeds():
    """docs/lambda-6tpp/PROTOCOL.md: unpaired unless both have the same seeds (docs/RULES.md pairs two shared)."""
    noise = Noise(within=0.02, within_dof=10, residual=0.01, residual_dof=6)
    a, b = {0: 2.9, 1: 2.95, 2: 3.5}, {0: 3.0, 1: 3.0}
    assert difference(a, b, noise).paired == 2
    unpaired = difference(a, b, noise, same_seeds_only=True)
    assert unpaired.paired == 0 and unpaired.diff == pytest.approx((2.9 + 2.95 + 3.5) / 3 - 3.0)
    assert unpaired.se == pytest.approx(0.02 * math.sqrt(1 / 3 + 1 / 2)) and unpaired.dof == 10
    same = difference({0: 2.9, 1: 2.95}, b, noise, same_seeds_only=True)
    assert same.paired == 2 and same.se == pytest.approx(0.01)


def test_noise_of_pools_both_estimates():
    found = noise_of([{0: 1.0, 1: 3.0}, {0: 2.0, 1: 2.0, 2: 5.0}])
    assert found.within == pytest.approx(math.sqrt((2 + 6) / 3)) and found.within_dof == 3
    # 5 runs, 2 configurations + 3 seeds - 1 = 4 parameters: 1 dof
    assert found.residual_dof == 1


def test_fisher_f_matches_its_closed_forms_and_scipy():
    for f in (0.2, 1.0, 7.5, 400.0):
        assert f_upper_p(f, 2, 2) == pytest.approx(1 / (1 + f))
        assert f_upper_p(f, 1, 3) == pytest.approx(t_two_sided_p(math.sqrt(f), 3))  # F(1, ν) = T(ν)²
    stats = pytest.importorskip("scipy.stats")
    for f, d1, d2 in ((0.7, 1, 5), (3.1, 2, 7), (12.0, 1, 3), (2.2, 4, 20)):
        assert f_upper_p(f, d1, d2) == pytest.approx(stats.f.sf(f, d1, d2), rel=1e-10)


# three configurations that spread alike over two seeds, and one that does not
STEADY = [{0: 1.00, 1: 1.01}, {0: 2.00, 1: 2.012}, {0: 3.00, 1: 3.008}]
ERRATIC = {0: 4.0, 1: 4.5}


def test_a_configuration_spread_far_beyond_the_others_is_flagged_and_stays_in_the_pooled_noise():
    """docs/RULES.md: no configuration leaves the pool; the F test is a flag shown beside."""
    [found] = unstable_spread([*STEADY, ERRATIC])
    steady = math.sqrt((0.01 ** 2 + 0.012 ** 2 + 0.008 ** 2) / 2 / 3)  # two-seed variances d²/2, pooled
    assert found["index"] == 3 and found["std"] == pytest.approx(0.5 / math.sqrt(2))
    assert found["others_std"] == pytest.approx(steady)
    assert found["p_value"] == pytest.approx(f_upper_p((0.5 / math.sqrt(2) / steady) ** 2, 1, 3))
    assert found["p_value"] < 0.05 / 4
    noise = noise_of([*STEADY, ERRATIC])
    everything = math.sqrt((0.01 ** 2 + 0.012 ** 2 + 0.008 ** 2 + 0.5 ** 2) / 2 / 4)
    assert noise.within == pytest.approx(everything) and noise.within_dof == 4 and len(noise.flagged) == 1
    assert noise.residual == block_residual_std([*STEADY, ERRATIC])[0] and noise.residual_dof == 3
    # the other analysis: without the flagged one, as the report shows beside
    other = without_flagged([*STEADY, ERRATIC], noise)
    assert other.within == pytest.approx(steady) and other.left_out == (3,)
    assert other.residual == block_residual_std(STEADY)[0] and other.residual_dof == 2
    # alike spreads: nothing flagged, no other analysis (a 2× spread is within what 1 and 3 dof allow)
    assert unstable_spread([*STEADY, {0: 4.0, 1: 4.02}]) == []
    assert noise_of(STEADY).flagged == () and without_flagged(STEADY, noise_of(STEADY)) is None


def test_the_other_analysis_judges_a_flagged_configuration_on_its_own_spread():
    noise = noise_of([*STEADY, ERRATIC])
    other = without_flagged([*STEADY, ERRATIC], noise)
    welch = difference(ERRATIC, STEADY[2], other, own_spread=(True, False))
    own, pooled = 0.125 / 2, other.within ** 2 / 2  # each mean's variance: s²/n
    assert welch.paired == 0 and welch.diff == pytest.approx(4.25 - 3.004)
    assert welch.se == pytest.approx(math.sqrt(own + pooled))
    assert welch.dof == pytest.approx((own + pooled) ** 2 / (own ** 2 / 1 + pooled ** 2 / 3))
    assert verdict_of(welch.p_value, welch.diff) == "within noise"  # 1.25 nats, yet 2 seeds this far apart
    # the registered (pooled) analysis: paired over both seeds, on the residual of every configuration
    pooled_model = difference(ERRATIC, STEADY[2], noise)
    assert pooled_model.paired == 2 and pooled_model.se == pytest.approx(noise.residual)


def test_the_seeds_guard_needs_every_seed_beyond_by_two_sigma_the_same_way():
    dense = {0: 3.00, 1: 3.01, 2: 3.02}
    assert seed_gaps({0: 3.2, 1: 3.5, 5: 3.3}, dense) == pytest.approx({0: 0.2, 1: 0.49, 5: 0.29})  # 5: vs the mean
    assert seeds_beyond({0: 3.2, 1: 3.5}, dense, 0.05) == "worse"
    assert seeds_beyond({0: 2.8, 1: 2.5}, dense, 0.05) == "better"
    assert seeds_beyond({0: 3.2, 1: 3.05}, dense, 0.05) is None  # one seed only 0.04 above: not beyond 2σ
    assert seeds_beyond({0: 3.2, 1: 2.5}, dense, 0.05) is None  # disagreeing directions
    assert seeds_beyond({0: 3.2}, dense, None) is None

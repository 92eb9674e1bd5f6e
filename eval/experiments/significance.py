"""Is a difference between two configurations real? The tests behind the report's verdicts.

A configuration is run at a few seeds (a seed sets the initialisation and the layer-dropout
masks; every run reads the data in the same order and is evaluated on the same held-out
tokens). Two noise estimates of a metric, each pooled over every configuration of the
sweep (a configuration's own spread over 2-3 seeds has 1-2 degrees of freedom, too few to
judge by):

- **within**: the pooled standard deviation over seeds, Σ(n_i − 1)s_i² / Σ(n_i − 1)
  (one-way ANOVA's error term): the noise of an unpaired difference;
- **residual**: the residual standard deviation of ``value = configuration + seed``
  fitted by least squares over every run (seeds as blocks, two-way ANOVA without
  interaction; degrees of freedom N − rank): the noise left in a per-seed difference
  once what a seed does to every configuration alike is taken out.

A comparison a − b is

- **paired** when a and b share two seeds or more: the mean over the shared seeds of
  a_s − b_s, with SE = σ_residual·√(2/n) (the per-seed differences already hold the
  evaluation noise: both runs are evaluated on the same tokens);
- **unpaired** otherwise: mean(a) − mean(b), with SE² = σ_within²·(1/n_a + 1/n_b) + eval²,
  eval the paired standard error of the two runs' held-out slices (report_tables).

Its verdict is a two-sided Student-t test at α = 0.05 on the noise estimate's degrees of
freedom: "better" (lower), "worse", "within noise", or "no noise estimate" while no
configuration has two seeds. A page makes many comparisons; ``holm`` adjusts their
p-values (Holm 1979: the k-th smallest of m is multiplied by m − k + 1, then made
monotone), so that a verdict "after Holm" keeps the chance of any false call at 5%.

The t distribution is hand-written (the regularized incomplete beta function), as scipy
is not a dependency; tests check it against scipy.stats where scipy is installed.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Hashable, Sequence

ALPHA = 0.05

Samples = dict[Hashable, float]  # seed -> value, one configuration's runs


@dataclass(frozen=True)
class Noise:
    """A metric's seed noise over a sweep's configurations (module docstring)."""

    within: float | None
    within_dof: int
    residual: float | None
    residual_dof: int


def noise_of(configurations: Sequence[Samples]) -> Noise:
    within, within_dof = pooled_std([list(c.values()) for c in configurations])
    residual, residual_dof = block_residual_std(configurations)
    return Noise(within, within_dof, residual, residual_dof)


def pooled_std(samples: Sequence[Sequence[float]]) -> tuple[float | None, int]:
    """Pooled standard deviation of several samples around their own means, and its dof."""
    dof = sum(len(s) - 1 for s in samples if len(s) > 1)
    if dof == 0:
        return None, 0
    squares = math.fsum((len(s) - 1) * statistics.variance(s) for s in samples if len(s) > 1)
    return math.sqrt(squares / dof), dof


def block_residual_std(configurations: Sequence[Samples]) -> tuple[float | None, int]:
    """Residual std of value = configuration + seed (least squares over every run), and its dof."""
    import numpy as np

    seeds = sorted({s for c in configurations for s in c}, key=repr)
    rows, values = [], []
    for index, configuration in enumerate(configurations):
        for seed, value in configuration.items():
            row = [0.0] * (len(configurations) + len(seeds))
            row[index] = 1.0
            row[len(configurations) + seeds.index(seed)] = 1.0
            rows.append(row)
            values.append(value)
    if not rows:
        return None, 0
    design, target = np.array(rows), np.array(values)
    coefficients, _, rank, _ = np.linalg.lstsq(design, target, rcond=None)
    dof = len(values) - int(rank)
    if dof <= 0:
        return None, 0
    residuals = target - design @ coefficients
    return math.sqrt(float(residuals @ residuals) / dof), dof


@dataclass
class Difference:
    diff: float
    reference: float  # b's mean over the seeds compared (the % is of it)
    se: float | None
    seed_se: float | None
    eval_se: float | None
    dof: float | None
    paired: int  # shared seeds compared pairwise (0: unpaired)

    @property
    def p_value(self) -> float | None:
        if self.se is None or self.dof is None:
            return None
        if self.se == 0:
            return 0.0 if self.diff else 1.0
        return t_two_sided_p(self.diff / self.se, self.dof)


def difference(a: Samples, b: Samples, noise: Noise, eval_se: float | None = None) -> Difference:
    """a − b, paired over their shared seeds when there are two or more (module docstring)."""
    shared = [s for s in a if s in b and s is not None]
    if len(shared) >= 2 and noise.residual is not None:
        diff = statistics.fmean(a[s] - b[s] for s in shared)
        se = noise.residual * math.sqrt(2 / len(shared))
        return Difference(diff, statistics.fmean(b[s] for s in shared), se, se, eval_se, noise.residual_dof,
                          len(shared))
    diff = statistics.fmean(a.values()) - statistics.fmean(b.values())
    seed_se = None if noise.within is None else noise.within * math.sqrt(1 / len(a) + 1 / len(b))
    if seed_se is None:  # the evaluation error alone would decide what another seed could reverse
        return Difference(diff, statistics.fmean(b.values()), eval_se, None, eval_se, None, 0)
    se = math.sqrt(seed_se ** 2 + (eval_se or 0.0) ** 2)
    return Difference(diff, statistics.fmean(b.values()), se, seed_se, eval_se, noise.within_dof, 0)


def verdict_of(p_value: float | None, diff: float, alpha: float = ALPHA) -> str:
    if p_value is None:
        return "no noise estimate"
    if p_value >= alpha:
        return "within noise"
    return "better" if diff < 0 else "worse"


def critical_t(dof: float, alpha: float = ALPHA) -> float:
    """|t| beyond which a two-sided test at ``alpha`` rejects (bisection on the p-value)."""
    low, high = 0.0, 1.0
    while t_two_sided_p(high, dof) > alpha:
        high *= 2
    for _ in range(100):
        middle = (low + high) / 2
        low, high = (middle, high) if t_two_sided_p(middle, dof) > alpha else (low, middle)
    return high


def t_two_sided_p(t: float, dof: float) -> float:
    """P(|T| ≥ |t|) for Student's t with ``dof`` degrees of freedom: I_x(ν/2, 1/2), x = ν/(ν + t²)."""
    if not math.isfinite(t):
        return 0.0
    return regularized_beta(dof / (dof + t * t), dof / 2, 0.5)


def regularized_beta(x: float, a: float, b: float) -> float:
    """I_x(a, b), by the continued fraction (Lentz's method; Numerical Recipes §6.4)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x > (a + 1) / (a + b + 2):  # the fraction converges fast on this side only
        return 1.0 - regularized_beta(1.0 - x, b, a)
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    result = d
    for m in range(1, 500):
        for numerator in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                          -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            result *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return front * result / a


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm-adjusted p-values, in the order given."""
    order = sorted(range(len(p_values)), key=lambda i: p_values[i])
    adjusted, running = [0.0] * len(p_values), 0.0
    for rank, index in enumerate(order):
        running = max(running, min(1.0, (len(p_values) - rank) * p_values[index]))
        adjusted[index] = running
    return adjusted


__all__ = ["ALPHA", "Noise", "noise_of", "pooled_std", "block_residual_std", "Difference", "difference", "verdict_of",
           "critical_t", "t_two_sided_p", "regularized_beta", "holm"]

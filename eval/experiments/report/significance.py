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

Pooling assumes every configuration spreads alike over seeds. One that does not (a run that
sometimes fails to recover from aggressive early dropout) is **flagged**: its variance tested
against the pooled variance of all the others (one-sided F test, Bonferroni over the configurations
tested). A flag is shown, never an exclusion: every configuration stays in both pooled estimates
and every verdict is the pooled one (docs/RULES.md). ``without_flagged`` gives the other analysis,
shown beside where its verdict differs: the flagged configurations out of the pool, their own
comparisons judged on their own spread (``own_spread``: Welch, SE² = s_a²/n_a + σ²/n_b with the
Welch–Satterthwaite degrees of freedom; unpaired, since its seeds are what is in doubt).

A comparison's verdict is a two-sided Student-t test at α = 0.05 on the noise estimate's degrees
of freedom: "better" (lower), "worse", "within noise", or "no noise estimate" while no
configuration has two seeds. **The seeds guard**: ``seeds_beyond`` is the direction in which
*every* seed of a lies beyond b by more than 2 pooled seed σ (a_s − b_s where b has seed s, else
a_s − mean(b)); a comparison with one is never labelled "within noise", before or after Holm
(report_tables, findings and budget_trend apply it). A page makes many comparisons; ``holm`` adjusts their
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
    flagged: tuple[dict, ...] = ()  # {"index", "std", "dof", "others_std", "p_value"}: spread beyond the others
    left_out: tuple[int, ...] = ()  # configurations not pooled (only in the other analysis, without_flagged)


def noise_of(configurations: Sequence[Samples], alpha: float = ALPHA) -> Noise:
    """Both pooled estimates over every configuration, and the F-test flags (none is left out)."""
    within, within_dof = pooled_std([list(c.values()) for c in configurations])
    residual, residual_dof = block_residual_std(configurations)
    return Noise(within, within_dof, residual, residual_dof, tuple(unstable_spread(configurations, alpha)))


def without_flagged(configurations: Sequence[Samples], noise: Noise) -> Noise | None:
    """The other analysis: the pooled estimates without the flagged configurations (None when none is)."""
    left_out = {u["index"] for u in noise.flagged}
    if not left_out:
        return None
    kept = [c for i, c in enumerate(configurations) if i not in left_out]
    within, within_dof = pooled_std([list(c.values()) for c in kept])
    residual, residual_dof = block_residual_std(kept)
    return Noise(within, within_dof, residual, residual_dof, noise.flagged, tuple(sorted(left_out)))


def seeds_beyond(a: Samples, b: Samples, sigma: float | None, factor: float = 2.0) -> str | None:
    """"worse" ("better") when every seed of a lies above (below) b by more than ``factor``·σ:
    a_s − b_s where b has seed s, else a_s − mean(b); None otherwise (module docstring)."""
    if sigma is None or not a or not b:
        return None
    gaps = list(seed_gaps(a, b).values())
    if all(g > factor * sigma for g in gaps):
        return "worse"
    if all(g < -factor * sigma for g in gaps):
        return "better"
    return None


def seed_gaps(a: Samples, b: Samples) -> Samples:
    """a_s − b_s for each seed of a: against b's run of the same seed, else against b's mean."""
    mean_b = statistics.fmean(b.values())
    return {seed: value - b.get(seed, mean_b) for seed, value in a.items()}


def unstable_spread(configurations: Sequence[Samples], alpha: float = ALPHA) -> list[dict]:
    """The configurations whose variance over seeds is beyond the pooled variance of all the
    others: F = s_i²/s_others² on (n_i − 1, dof_others), one-sided, at α / (configurations tested)."""
    tested = [i for i, c in enumerate(configurations) if len(c) > 1]
    found = []
    for index in tested:
        others, dof = pooled_std([list(c.values()) for i, c in enumerate(configurations) if i != index])
        if not others or not dof:
            continue
        own = statistics.stdev(configurations[index].values())
        p_value = f_upper_p((own / others) ** 2, len(configurations[index]) - 1, dof)
        if p_value < alpha / len(tested):
            found.append({"index": index, "std": own, "dof": len(configurations[index]) - 1, "others_std": others,
                          "p_value": p_value})
    return found


def f_upper_p(f: float, dof_1: float, dof_2: float) -> float:
    """P(F ≥ f) for Fisher's F on (dof_1, dof_2) degrees of freedom:
    I_x(ν₂/2, ν₁/2) with x = ν₂/(ν₂ + ν₁f)."""
    if not math.isfinite(f):
        return 0.0
    return regularized_beta(dof_2 / (dof_2 + dof_1 * f), dof_2 / 2, dof_1 / 2)


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


def difference(a: Samples, b: Samples, noise: Noise, eval_se: float | None = None,
               own_spread: tuple[bool, bool] = (False, False), same_seeds_only: bool = False) -> Difference:
    """a − b, paired over their shared seeds when there are two or more (``same_seeds_only``: only
    when a and b have the very same seeds, docs/lambda-6tpp/PROTOCOL.md's rule); on a's (b's) own
    spread where ``own_spread`` says so (the other analysis of a flagged configuration: module docstring)."""
    if any(own_spread):
        return _welch(a, b, noise, eval_se, own_spread)
    shared = [s for s in a if s in b and s is not None] if not same_seeds_only or set(a) == set(b) else []
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


def _welch(a: Samples, b: Samples, noise: Noise, eval_se: float | None,
           own_spread: tuple[bool, bool]) -> Difference:
    parts = []  # (variance of the side's mean, its dof)
    for side, own in zip((a, b), own_spread):
        if own and len(side) > 1:
            parts.append((statistics.variance(side.values()) / len(side), len(side) - 1))
        elif noise.within is not None:
            parts.append((noise.within ** 2 / len(side), noise.within_dof))
        else:
            parts.append((None, 0))
    diff = statistics.fmean(a.values()) - statistics.fmean(b.values())
    if any(v is None for v, _ in parts):
        return Difference(diff, statistics.fmean(b.values()), eval_se, None, eval_se, None, 0)
    seed_variance = math.fsum(v for v, _ in parts)
    dof = seed_variance ** 2 / math.fsum(v * v / d for v, d in parts if v > 0) if seed_variance > 0 else None
    se = math.sqrt(seed_variance + (eval_se or 0.0) ** 2)
    return Difference(diff, statistics.fmean(b.values()), se, math.sqrt(seed_variance), eval_se, dof, 0)


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


__all__ = ["ALPHA", "Noise", "noise_of", "without_flagged", "seeds_beyond", "seed_gaps", "unstable_spread",
           "f_upper_p", "pooled_std", "block_residual_std", "Difference", "difference", "verdict_of", "critical_t",
           "t_two_sided_p", "regularized_beta", "holm"]

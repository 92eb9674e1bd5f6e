"""How a finding's comparisons become its verdict, and the page's comparisons' Holm adjustment.

Configurations are matched by what they are (their layer-dropout settings and P̄), never
by run names. Each comparison reads "a is <expected> than b" in the paper and has a
Student-t verdict (eval/experiments/report/significance.py). A finding is

- **reproduced**: every comparison it counts goes the paper's way beyond the noise;
- **not reproduced**: one goes the other way beyond the noise, and beyond the paper's own
  figure for it where the paper reports one (eval/experiments/report/findings/paper.py);
- **consistent with the paper's own figure**: those that go the other way are within the
  noise of (or below) the loss the paper itself reports for them;
- **within noise**: otherwise (nothing against the paper, not all for it);
- **not tested**: the sweep holds no configurations the claim can be checked on.

Comparisons marked ``observation`` are printed with their numbers but decide nothing and
are not among the page's tests. The page's tests (every other comparison with a p-value,
and the correlation tests) are one family for Holm's adjustment: each finding also gets the
verdict its comparisons give after it (``verdict_holm``).
"""

from __future__ import annotations

import json
from typing import Callable, Iterable

from eval.experiments.report.findings.paper import CLAIMS, against_paper
from eval.experiments.report.tables import Comparison, Configuration, compare_configurations
from eval.experiments.report.significance import ALPHA, holm
from eval.experiments.sweep.results import LAYER_DROPOUT_DEFAULTS, RunResult

Metric = Callable[[RunResult], float | None]
# The recommended structure, mask and r_train (LayerDropoutConfig's defaults).
RECOMMENDED = {key: LAYER_DROPOUT_DEFAULTS[key] for key in ("structure", "mask", "r_train")}
CONSISTENT = "within noise of or below the paper's figure"


def dropout(configuration: Configuration) -> dict:
    return {**RECOMMENDED, **{k: v for k, v in configuration.first.layer_dropout.items() if k != "seed"}}


def p_bar(configuration: Configuration) -> float:
    return float(configuration.first.summary["mean_dropout_predicted"])


def exit_loss_scale(configuration: Configuration) -> float:
    """LayerSkip's early-exit loss scale the configuration trained with (0: off)."""
    return float(json.loads(configuration.key).get("model.early_exit_loss.scale") or 0.0)


def is_recommended(configuration: Configuration) -> bool:
    """ILD + DTS with the recommended structure, mask and r_train."""
    d = dropout(configuration)
    return d["distribution"] == "increasing" and d["schedule"] == "decreasing" and d == {**d, **RECOMMENDED}


def strip(configuration: Configuration, prefix: str) -> dict:
    """The configuration's settings but those under ``prefix``."""
    return {k: v for k, v in json.loads(configuration.key).items() if not k.startswith(prefix)}


def same_outside_dropout(x: Configuration, y: Configuration) -> bool:
    return strip(x, "model.layer_dropout.") == strip(y, "model.layer_dropout.")


def same_rest(x: Configuration, y: Configuration) -> bool:
    """Equal structure, mask, r_train and every setting outside the layer dropout."""
    return all(dropout(x)[k] == dropout(y)[k] for k in RECOMMENDED) and same_outside_dropout(x, y)


def twins(configurations: list[Configuration], key: str, a: object,
          b: object) -> list[tuple[Configuration, Configuration]]:
    """Pairs (x, y) of configurations equal in every layer-dropout setting but ``key``,
    where x has ``key = a`` and y has ``key = b`` (and equal in everything else)."""
    pairs = []
    for x in configurations:
        for y in configurations:
            dx, dy = dropout(x), dropout(y)
            if dx.get(key) == a and dy.get(key) == b and \
                    {k: v for k, v in dx.items() if k != key} == {k: v for k, v in dy.items() if k != key} \
                    and same_outside_dropout(x, y):
                pairs.append((x, y))
    return pairs


def judge(a: Configuration, b: Configuration, metric: Metric, configurations: list[Configuration], *,
          higher_is_better: bool = False, with_eval_noise: bool = True) -> Comparison | None:
    """a against b on ``metric``, with its seed noise pooled over ``configurations``."""
    return compare_configurations(a, b, metric, configurations, higher_is_better=higher_is_better,
                                  with_eval_noise=with_eval_noise)


def with_paper(comparison: Comparison | None, pct: float | None, source: str | None,
               expected: str = "better") -> Comparison | None:
    """The comparison with the paper's own %Δ beside it, and whether ours is consistent with it."""
    if comparison is not None and pct is not None:
        comparison.paper_pct, comparison.paper_source = pct, source
        comparison.vs_paper = against_paper(comparison, expected)
    return comparison


def verdict(comparisons: Iterable[dict], expected: str = "better", field: str = "verdict") -> str:
    """The finding's verdict from its comparisons (as_dict()); ``field``: "verdict", or
    "verdict_holm" for the verdict after Holm's adjustment."""
    counted = [c for c in comparisons if c is not None and not c.get("observation")]
    if not counted:
        return "not tested"
    opposite = "worse" if expected == "better" else "better"
    against = [c for c in counted if c[field] == opposite]
    if against:
        if all(c.get("vs_paper") == CONSISTENT for c in against):
            return "consistent with the paper's own figure"
        return "not reproduced"
    if all(c[field] == expected for c in counted):
        return "reproduced"
    return "within noise"


def finding(identifier: str, claim: str, test: str, comparisons: list[Comparison | None],
            expected: str = "better", **extra: object) -> dict:
    kept = [c.as_dict() for c in comparisons if c is not None]
    return {"id": identifier, "claim": claim, "paper": CLAIMS.get(identifier), "test": test, "expected": expected,
            "verdict": verdict(kept, expected), "comparisons": kept, **extra}


def correlation_verdict(tests: dict[str, dict], field: str = "p_value") -> str:
    """Finding 6: every correlation negative and significant; positive and significant: against."""
    if not tests:
        return "not tested"
    if all(t["spearman"] < 0 and t[field] < ALPHA for t in tests.values()):
        return "reproduced"
    if any(t["spearman"] > 0 and t[field] < ALPHA for t in tests.values()):
        return "not reproduced"
    return "within noise"


def holm_adjust(findings: list[dict], rows: list[dict], others: Iterable[dict] = ()) -> dict:
    """Holm over every test on the page (findings' comparisons that decide, correlation
    tests, the configuration table's comparisons with dense, and ``others``: the comparisons
    at each configuration's own optimum; one test per distinct pair, metric and pairing):
    sets ``p_holm`` and ``verdict_holm`` on each, and each finding's ``verdict_holm``.
    Returns what the page says about it."""
    everything: dict[tuple, list[dict]] = {}  # every comparison shown, by (a, b, metric, seeds paired)
    tested: set[tuple] = set()
    for found in findings:
        for comparison in found["comparisons"]:
            key = _test_key(comparison)
            everything.setdefault(key, []).append(comparison)
            if comparison.get("p_value") is not None and not comparison.get("observation"):
                tested.add(key)
        for name, test in (found.get("correlations") or {}).items():
            if test.get("p_value") is not None:
                everything.setdefault((found["id"], name), []).append(test)
                tested.add((found["id"], name))
    for comparison in [row["vs_dense"] for row in rows if row.get("vs_dense")] + list(others):
        key = _test_key(comparison)
        everything.setdefault(key, []).append(comparison)
        if comparison.get("p_value") is not None:
            tested.add(key)
    for comparisons in everything.values():
        for comparison in comparisons:
            if "verdict" in comparison:
                comparison["verdict_holm"] = comparison["verdict"]
    keys = [k for k in everything if k in tested]
    for key, adjusted in zip(keys, holm([everything[k][0]["p_value"] for k in keys])):
        for test in everything[key]:
            test["p_holm"] = adjusted
            if "verdict" in test:  # the seeds guard holds after Holm too (significance.py)
                test["verdict_holm"] = test["verdict"] if adjusted < ALPHA else \
                    test.get("seeds_beyond") or "within noise"
    for found in findings:
        if found.get("correlations") is not None:
            found["verdict_holm"] = correlation_verdict(found["correlations"], "p_holm") \
                if found["correlations"] else found["verdict"]
        elif found["verdict"] in ("not tested", "no compute-matched baseline") or found.get("verdict_from"):
            found["verdict_holm"] = found["verdict"]
        else:
            found["verdict_holm"] = verdict(found["comparisons"], found["expected"], "verdict_holm")
    return {"tests": len(keys), "alpha": ALPHA, "expected_by_chance": len(keys) * ALPHA}


def _test_key(comparison: dict) -> tuple:
    """One test per pair, metric and pairing: the same two configurations compared unpaired (the
    own-optimum rule, docs/lambda-6tpp/PROTOCOL.md) and paired over shared seeds are two tests."""
    return comparison["a"], comparison["b"], comparison.get("metric"), comparison.get("paired", 0)


__all__ = ["RECOMMENDED", "CONSISTENT", "dropout", "p_bar", "exit_loss_scale", "is_recommended", "strip",
           "same_outside_dropout", "same_rest", "twins", "judge", "with_paper", "verdict", "finding",
           "correlation_verdict", "holm_adjust"]

"""The paper's own numbers, printed beside ours, and whether ours are consistent with them.

From "Don't Drop Dropout" (arXiv 2609.05275): every model trained at
20 tokens per parameter. The tables give validation loss and its %Δ against dense at equal
steps; a configuration is keyed by (distribution, schedule, p_max) with the recommended
layer structure, per-sequence masks and r_train = 1/ρ:

- Table 3: per P̄ (5, 10, 20%): uniform (constant), ILD constant, ILD+ITS, ILD+DTS;
- Table 2: ALD (constant) at P̄ 10 and 20% (its uniform and ILD rows are Table 3's);
- Table 1: sub-layer vs layer dropout at rate 0.1 (the distribution is not stated);
- Table 4: self-speculative speedups; Fig. 3: the optimal η, λ and B stay put across
  dropout rates with r_train = 1/ρ (the Limitations: they fall at aggressive rates);
  Fig. 9: at equal training FLOPs, dropout's curve is below dense's (no number; Table 5
  at equal steps: 1.8B −0.70% while saving 15% of the FLOPs).

Our model is smaller than any of the paper's, so its figure is the one at the nearest size
by non-embedding parameters (in practice 271M for every CPU run).

A comparison that goes against the paper beyond the noise is still **consistent with the
paper's own figure** when the difference from the paper's figure is within the noise (the
same two-sided t test, its null moved to the paper's %Δ), or beyond it in the paper's favour.
"""

from __future__ import annotations

import math

from eval.experiments.report.significance import critical_t

# Non-embedding parameters (blocks + final norm) of the Table A.1 shapes, from
# eval.experiments.sweep.spec.non_embedding_parameters(ModelConfig.paper(name)); Tables 1-3
# call the 504M shape "503M".
SIZES = {"271M": 106_638_720, "503M": 273_218_176, "906M": 610_920_576}

# %Δ validation loss vs dense at equal steps, as printed (Table 3; Table 2 for ALD).
PCT_VS_DENSE: dict[str, dict[tuple[str, str, float], float]] = {
    "271M": {("uniform", "constant", 0.05): 0.77, ("increasing", "constant", 0.1): 0.73,
             ("increasing", "increasing", 0.2): 1.36, ("increasing", "decreasing", 0.2): 0.46,
             ("uniform", "constant", 0.1): 1.62, ("increasing", "constant", 0.2): 1.52,
             ("increasing", "increasing", 0.4): 2.75, ("increasing", "decreasing", 0.4): 0.82,
             ("uniform", "constant", 0.2): 3.27, ("increasing", "constant", 0.4): 3.01,
             ("increasing", "increasing", 0.8): 6.46, ("increasing", "decreasing", 0.8): 2.93,
             ("alternating", "constant", 0.2): 1.29, ("alternating", "constant", 0.4): 2.76},
    "503M": {("uniform", "constant", 0.05): 0.67, ("increasing", "constant", 0.1): 0.56,
             ("increasing", "increasing", 0.2): 1.38, ("increasing", "decreasing", 0.2): 0.03,
             ("uniform", "constant", 0.1): 1.48, ("increasing", "constant", 0.2): 1.08,
             ("increasing", "increasing", 0.4): 2.95, ("increasing", "decreasing", 0.4): 0.28,
             ("uniform", "constant", 0.2): 3.05, ("increasing", "constant", 0.4): 2.48,
             ("increasing", "increasing", 0.8): 6.99, ("increasing", "decreasing", 0.8): 1.75,
             ("alternating", "constant", 0.2): 1.57, ("alternating", "constant", 0.4): 2.82},
    "906M": {("uniform", "constant", 0.05): 0.54, ("increasing", "constant", 0.1): 0.42,
             ("increasing", "increasing", 0.2): 1.34, ("increasing", "decreasing", 0.2): -0.06,
             ("uniform", "constant", 0.1): 1.26, ("increasing", "constant", 0.2): 1.01,
             ("increasing", "increasing", 0.4): 3.15, ("increasing", "decreasing", 0.4): 0.10,
             ("uniform", "constant", 0.2): 2.82, ("increasing", "constant", 0.4): 2.34,
             ("increasing", "increasing", 0.8): 7.04, ("increasing", "decreasing", 0.8): 1.55,
             ("alternating", "constant", 0.2): 1.36, ("alternating", "constant", 0.4): 2.66},
}
# Table 1: %Δ vs dense of sub-layer and layer dropout at rate 0.1.
SUBLAYER_VS_DENSE = {"271M": (3.61, 3.18), "503M": (3.03, 2.84)}

CLAIMS = {
    "headline": "Table 3 at P̄ 5% (ILD+DTS p_max 0.2): 271M +0.46%, 503M +0.03%, 906M −0.06% vs dense",
    "cost-at-equal-steps": "Table 3, ILD+DTS vs dense: P̄ 10% +0.82/+0.28/+0.10%, P̄ 20% +2.93/+1.75/+1.55% "
                           "(271M/503M/906M)",
    "pareto": "Fig. 9 (1.8B/3.9B, p_max 0.6/0.8): dropout's loss below dense's at equal FLOPs through most of "
              "training (no number; Table 5 at equal steps: 1.8B −0.70% while saving 15%)",
    "finding-1": "Table 1 (rate 0.1): sub-layer vs layer +0.42% (271M), +0.18% (503M)",
    "finding-2": "Fig. 4 (p_max 0.2, 0.4): per-sequence below per-batch at 271M-906M (no number in the text)",
    "finding-3": "Table 2: ILD/ALD vs uniform at P̄ 10%: −0.10%/−0.32%, at P̄ 20%: −0.25%/−0.49% (271M)",
    "finding-4": "Table 3 (271M): ILD+DTS vs ILD+ITS −0.89/−1.88/−3.32% at P̄ 5/10/20%; vs ILD constant "
                 "−0.27/−0.69/−0.08%",
    "early-exit": "Fig. 5, A.2: every exit of a dropout-trained model below dense's (no number)",
    "finding-6": "§8.1 (no number): higher P̄, smaller early-exit and skip degradation",
    "skip-ald": "Figs 6, A.3c: ALD below ILD at equal P̄ when alternate layers are skipped (no number)",
    "r-train": "Fig. 3 (271M): with r_train = 1/ρ the optimal η, λ and B stay put across dropout rates 0-0.4 "
               "(Limitations: they fall at aggressive rates)",
    "speculative": "Table 4: dense 1.01×, ILD 0.2 1.20×, ILD 0.4 1.35×, ILD+DTS 0.4 1.22× (270M)",
}


def nearest_size(non_embedding_params: int | None) -> str:
    """The paper size nearest ours in log(non-embedding parameters)."""
    if not non_embedding_params:
        return "271M"
    return min(SIZES, key=lambda name: abs(math.log(SIZES[name] / non_embedding_params)))


def paper_key(dropout: dict) -> tuple[str, str, float] | None:
    """(distribution, schedule, p_max) when the configuration is one of the tables' (the
    recommended structure, mask and r_train); else None."""
    if (dropout.get("structure"), dropout.get("mask"), dropout.get("r_train")) != \
            ("layer", "sequence", "inverse_density") or isinstance(dropout.get("distribution"), list):
        return None
    return str(dropout["distribution"]), str(dropout["schedule"]), round(float(dropout["p_max"]), 4)


def paper_pct(a: dict, b: dict | None, size: str) -> tuple[float | None, str | None]:
    """The paper's %Δ of configuration a vs b (b None: dense) at ``size``, and its source."""
    table = PCT_VS_DENSE.get(size, {})
    key_a = paper_key(a)
    if key_a not in table:
        return None, None
    source = "Table 2" if key_a[0] == "alternating" else "Table 3"
    if b is None:
        return table[key_a], f"{source}, {size}"
    key_b = paper_key(b)
    if key_b not in table:
        return None, None
    sources = sorted({source, "Table 2" if key_b[0] == "alternating" else "Table 3"})
    return 100 * ((1 + table[key_a] / 100) / (1 + table[key_b] / 100) - 1), f"{' and '.join(sources)}, {size}"


def sublayer_pct(size: str) -> tuple[float, str]:
    size = size if size in SUBLAYER_VS_DENSE else "503M" if SIZES[size] > SIZES["503M"] else "271M"
    sub, layer = SUBLAYER_VS_DENSE[size]
    return 100 * ((1 + sub / 100) / (1 + layer / 100) - 1), f"Table 1 (rate 0.1), {size}"


def against_paper(comparison, expected: str) -> str | None:
    """For a comparison with the paper's %Δ: is ours within the noise of (or beyond in the
    paper's favour) the paper's own figure? ``expected``: the paper's direction for a − b."""
    if comparison.paper_pct is None or comparison.se is None or comparison.dof is None or not comparison.reference:
        return None
    paper = comparison.paper_pct / 100 * comparison.reference
    gap = comparison.diff - paper  # ours minus the paper's, in nats
    sign = 1.0 if expected == "better" else -1.0  # "better": the paper says a is lower
    seeds = (comparison.seed_gaps or {}).values()
    if seeds and comparison.seed_sigma is not None and \
            all(sign * (g - paper) > 2 * comparison.seed_sigma for g in seeds):
        return "beyond the paper's figure"  # every seed beyond it by > 2 pooled σ: never "consistent" (RULES.md)
    if comparison.se == 0:
        return "within noise of or below the paper's figure" if sign * gap <= 0 else "beyond the paper's figure"
    beyond = sign * gap / comparison.se > critical_t(comparison.dof)
    return "beyond the paper's figure" if beyond else "within noise of or below the paper's figure"


__all__ = ["SIZES", "PCT_VS_DENSE", "CLAIMS", "nearest_size", "paper_key", "paper_pct", "sublayer_pct",
           "against_paper"]

"""Loss against one hyperparameter, per series, from a sweep's runs: tuning, µTransfer, Fig. 3.

A sweep that varies a hyperparameter (η = model.parametrization.lr, σ =
model.decoder.init_std, τ_EMA = model.parametrization.tau_ema) has, for each of them, one
curve per *series*: the runs that agree on every other setting that varies in the sweep
(the seeds aside). A point is the mean loss over the seeds there, with the seeds' spread
as its band; the series' optimum is its point of lowest mean loss.

Three readings of the same curves:

- tuning (`layerdrop tune`): loss vs η, σ and τ_EMA through the best point so far;
- µTransfer: a sweep over width (model.decoder.d_model) and/or depth (n_layers) and η per
  parametrization (model.parametrization.kind): the optimal η_base per shape, and its
  drift from the base shape's, in factors of 2 (log₂) along the η grid. Under
  ``complete_p`` it should stay put; under ``standard`` it is expected to move;
- Fig. 3 of the paper: loss vs η (and vs τ_EMA, i.e. λ) per p_max, with r_train = 1/ρ and
  with r_train = 1, one family per schedule; the claim "the optimum stays put with 1/ρ" holds
  when every p_max's optimum is the reference's grid point or tied with it within the seed
  noise, and fails when one moves beyond it (``figure3``).

Also: runs whose validation loss rose from one evaluation during training to the next
(their curve, from the TensorBoard logs or curve.json): a sign of instability.
"""

from __future__ import annotations

import json
import math
import statistics
from typing import Any

from eval.experiments.report.significance import pooled_std
from eval.experiments.sweep.results import IGNORED_KEYS, RunResult, flatten
from eval.experiments.sweep.spec import get_dotted as get
from eval.measurements.plots import MARKERS, plt

HYPERPARAMETERS = {"model.parametrization.lr": "η", "model.decoder.init_std": "σ",
                   "model.parametrization.tau_ema": "τ_EMA"}
WIDTH, DEPTH, KIND = "model.decoder.d_model", "model.decoder.n_layers", "model.parametrization.kind"
P_MAX, R_TRAIN = "model.layer_dropout.p_max", "model.layer_dropout.r_train"
# A validation loss on the same fixed tokens that rises by less than this between two
# evaluations is float noise of a converged run (seen: ~1e-4 in the last evaluations
# of a decayed LR); more is a rise worth a look.
RISE_TOLERANCE = 1e-3


def varying_keys(results: list[RunResult]) -> list[str]:
    """The settings that differ between runs (seeds, paths and bookkeeping aside). A key
    some configs lack does not vary by that alone: runs resolved by an older version (a
    finished run adopted from a report) lack the settings added since."""
    flats = [flatten(r.config) for r in results]
    keys = sorted({k for flat in flats for k in flat} - set(IGNORED_KEYS))
    return [k for k in keys if len({json.dumps(flat[k], default=str) for flat in flats if k in flat}) > 1]


def curves(results: list[RunResult], key: str) -> list[dict]:
    """Loss vs ``key``: one series per combination of the other varying settings that
    has at least two values of ``key``; points sorted by value."""
    others = [k for k in varying_keys(results) if k != key]
    series: dict[str, dict] = {}
    for run in results:
        flat = flatten(run.config)
        value, loss = flat.get(key), run.val_loss
        if value is None or loss is None:
            continue
        settings = {k: flat.get(k) for k in others}
        entry = series.setdefault(json.dumps(settings, sort_keys=True, default=str),
                                  {"settings": settings, "by_value": {}})
        entry["by_value"].setdefault(json.dumps(value), []).append(loss if math.isfinite(loss) else math.inf)
    out = []
    for entry in series.values():
        if len(entry["by_value"]) < 2:
            continue
        points = [_point(json.loads(v), losses) for v, losses in entry["by_value"].items()]
        points.sort(key=lambda p: p["value"])
        optimum = min(range(len(points)), key=lambda i: points[i]["mean"])
        out.append({"key": key, "label": series_label(entry["settings"]), "settings": entry["settings"],
                    "points": points, "optimum_index": optimum, "optimum": points[optimum]["value"],
                    "at_edge": optimum in (0, len(points) - 1)})
    return sorted(out, key=lambda c: [_order(v) for v in c["settings"].values()])


def _order(value: Any) -> tuple:
    """Numbers by size (d_model 64 before 128), anything else by its text."""
    return (0, float(value), "") if isinstance(value, (int, float)) and not isinstance(value, bool) \
        else (1, 0.0, str(value))


def _point(value: Any, losses: list[float]) -> dict:
    finite = all(math.isfinite(v) for v in losses)
    return {"value": value, "losses": losses, "seeds": len(losses),
            "mean": statistics.fmean(losses) if finite else math.inf,
            "std": statistics.stdev(losses) if finite and len(losses) > 1 else None,
            "min": min(losses), "max": max(losses)}


def series_label(settings: dict[str, Any]) -> str:
    return ", ".join(f"{k.split('.')[-1]}={v}" for k, v in settings.items()) or "all runs"


def swept_curves(results: list[RunResult]) -> dict[str, list[dict]]:
    """The curves of every hyperparameter the sweep varies."""
    varying = set(varying_keys(results))
    return {key: found for key in HYPERPARAMETERS if key in varying and (found := curves(results, key))}


# -------------------------------------------------------------------- µTransfer
def transfer_table(lr_curves: list[dict], base_shape: tuple[int, int] | None = None,
                   kind_of_all: str | None = None) -> list[dict] | None:
    """Per parametrization, the optimal η of each shape, its drift from the reference
    shape's in log₂, and its regret: the loss at the reference's optimal η (what transfer
    would have given this shape) minus the loss at its own optimum. The reference is the
    parametrization's base shape (``base_shape`` = (d_base, n_layers_base)) where the sweep
    ran it, else its smallest shape (width, then depth). ``kind_of_all``: the
    parametrization when the sweep does not vary it. None when the sweep varies neither
    width nor depth."""
    if not any(WIDTH in c["settings"] or DEPTH in c["settings"] for c in lr_curves):
        return None
    rows = []
    by_kind: dict[str, list[dict]] = {}
    for curve in lr_curves:
        by_kind.setdefault(str(curve["settings"].get(KIND, kind_of_all or "")), []).append(curve)
    for kind, group in sorted(by_kind.items()):
        group.sort(key=lambda c: (c["settings"].get(WIDTH) or 0, c["settings"].get(DEPTH) or 0))
        reference = next((c for c in group if base_shape and _shape(c, base_shape) == base_shape), group[0])
        for curve in group:
            best = curve["points"][curve["optimum_index"]]["mean"]
            transferred = next((p["mean"] for p in curve["points"] if p["value"] == reference["optimum"]), None)
            rows.append({"parametrization": kind or None, "d_model": curve["settings"].get(WIDTH),
                         "n_layers": curve["settings"].get(DEPTH), "series": curve["label"],
                         "reference": curve is reference, "optimal_lr": curve["optimum"], "loss": best,
                         "drift_log2": math.log2(curve["optimum"] / reference["optimum"]),
                         "transferred_lr": reference["optimum"], "loss_at_transferred": transferred,
                         "regret": None if transferred is None else transferred - best,
                         "at_edge": curve["at_edge"]})
    return rows


def _shape(curve: dict, base_shape: tuple[int, int]) -> tuple[int, int]:
    """The curve's (width, depth), the base's where the sweep does not vary it."""
    return (curve["settings"].get(WIDTH, base_shape[0]), curve["settings"].get(DEPTH, base_shape[1]))


def shared_value(results: list[RunResult], key: str) -> Any:
    """The value of ``key`` every run has, or None when they differ or lack it."""
    values = {json.dumps(get(r.config, key), default=str) for r in results}
    return json.loads(values.pop()) if len(values) == 1 else None


def base_shape_of(results: list[RunResult]) -> tuple[int, int] | None:
    """(d_base, n_layers_base) when every run names the same parametrization base."""
    shape = (shared_value(results, "model.parametrization.d_base"),
             shared_value(results, "model.parametrization.n_layers_base"))
    return None if None in shape else shape


def transfer_verdicts(rows: list[dict]) -> list[dict]:
    """Per parametrization: does the optimal η stay put (the same grid value for every
    shape), or how far does it move, and what does using the reference's η cost at the
    worst shape? An optimum at the edge of its grid is flagged: the true one may lie beyond."""
    verdicts = []
    for kind in dict.fromkeys(r["parametrization"] for r in rows):
        group = [r for r in rows if r["parametrization"] == kind]
        worst = max(abs(r["drift_log2"]) for r in group)
        regrets = [r["regret"] for r in group if r["regret"] is not None]
        verdict = "optimum stays put" if worst == 0 else f"optimum moves (up to 2^{worst:.2g}×)"
        if worst and regrets:
            verdict += f"; the reference's η costs up to {max(regrets):.4f} nats"
        verdicts.append({"parametrization": kind, "max_drift_log2": worst,
                         "max_regret": max(regrets) if regrets else None, "verdict": verdict,
                         "edge": any(r["at_edge"] for r in group)})
    return verdicts


# ------------------------------------------------------------------------ Fig. 3
def figure3(curves_by_key: dict[str, list[dict]], sigma: float | None = None) -> list[dict] | None:
    """For loss vs η and vs τ_EMA: per *family* (r_train and every other setting but p_max: the
    distribution, the schedule, the early-exit loss), the optimum per p_max and whether it stays
    put — None when the sweep does not vary p_max. The dense curve (p_max 0, where the family's
    settings change nothing) is every family's reference.

    Whether a curve's optimum moves from the reference's is judged as docs/lambda-6tpp/PROTOCOL.md
    judges λ, and only where both brackets are closed (the best point inside the key's grid, it and
    both grid neighbours with ≥ 2 seeds): the same grid point is "same"; elsewhere it *moves* when
    its mean at the reference's optimum exceeds its best by more than 2σ·√(1/n₁ + 1/n₂) (σ pooled
    over every configuration with ≥ 2 seeds: ``sigma``, the page's, else the curves' points), and is
    *tied* when it does not. Anything short of that is *undecided*, with why: one seed never decides
    where an optimum lies."""
    found = []
    for key in ("model.parametrization.lr", "model.parametrization.tau_ema"):
        series = [c for c in curves_by_key.get(key, []) if P_MAX in c["settings"]]
        if not series:
            continue
        noise = sigma if sigma is not None else _pooled_sigma(curves_by_key[key])
        grid = sorted({p["value"] for c in curves_by_key[key] for p in c["points"]})
        families: dict[str, list[dict]] = {}
        for curve in series:
            family = {k: v for k, v in curve["settings"].items() if k != P_MAX}
            families.setdefault(json.dumps(family, sort_keys=True, default=str), []).append(curve)
        dense = [c for c in series if float(c["settings"][P_MAX]) == 0]
        families = {k: g for k, g in families.items() if any(float(c["settings"][P_MAX]) for c in g)}
        # a family is named by the settings that tell it from the others (r_train has its own column)
        named = [k for k in {k for f in families for k in json.loads(f)} - {R_TRAIN}
                 if len({json.dumps(json.loads(f).get(k), default=str) for f in families}) > 1]
        for family_key, group in families.items():
            if dense and not any(float(c["settings"][P_MAX]) == 0 for c in group):
                group.append(dense[0])
            group.sort(key=lambda c: float(c["settings"][P_MAX]))
            reference = group[0]
            optima = [{"p_max": c["settings"][P_MAX], "optimum": c["optimum"], "index": c["optimum_index"],
                       "series": c["label"], "seeds": c["points"][c["optimum_index"]]["seeds"],
                       "position": "reference" if c is reference else _position(c, reference, noise, grid)}
                      for c in group]
            family = json.loads(family_key)
            r_train = str(family.get(R_TRAIN, "as configured"))
            label = series_label({k: family.get(k) for k in sorted(named)})
            found.append({"key": key, "r_train": r_train, "family": label if named else None,
                          "sigma": noise, "optima": optima, "verdict": _moves_verdict(optima)})
    return found or None


def _pooled_sigma(found: list[dict]) -> float | None:
    """The seed standard deviation pooled over every point with ≥ 2 seeds (significance.pooled_std)."""
    return pooled_std([p["losses"] for c in found for p in c["points"] if p["std"] is not None])[0]


def _open(curve: dict, grid: list) -> str | None:
    """Why the curve's bracket is open (its best on the key's grid edge, or its best or a grid
    neighbour with fewer than 2 seeds), or None when it is closed (docs/lambda-6tpp/PROTOCOL.md)."""
    best = curve["optimum"]
    index = grid.index(best)
    if index in (0, len(grid) - 1):
        return f"its best, {best:g}, is at the grid's edge"
    seeds = {p["value"]: p["seeds"] for p in curve["points"]}
    short = [v for v in (grid[index - 1], best, grid[index + 1]) if seeds.get(v, 0) < 2]
    return None if not short else "fewer than 2 seeds at " + ", ".join(
        f"{v:g} ({seeds[v] if v in seeds else 'not run'})" for v in short)


def _position(curve: dict, reference: dict, sigma: float | None, grid: list) -> str:
    """Where ``curve``'s optimum sits against the reference's: same, moves, tied or undecided (why)."""
    dense = float(reference["settings"][P_MAX]) == 0
    for who, found in (("the dense curve's" if dense else "the reference's", reference), ("its", curve)):
        if (why := _open(found, grid)) is not None:
            return f"undecided: {who} bracket is open ({why.removeprefix('its ')})"
    if curve["optimum"] == reference["optimum"]:
        return "same"
    best = curve["points"][curve["optimum_index"]]
    there = next((p for p in curve["points"] if p["value"] == reference["optimum"]), None)
    if there is None or there["seeds"] < 2:
        return f"undecided: {'not run' if there is None else '1 seed'} at the dense optimum {reference['optimum']:g}"
    if sigma is None:
        return "undecided: no seed noise"
    gap = there["mean"] - best["mean"]
    bar = 2 * sigma * math.sqrt(1 / best["seeds"] + 1 / there["seeds"])
    if gap > bar:
        return f"moves (+{gap:.4f} at the dense optimum, beyond {bar:.4f})"
    return f"tied (+{gap:.4f} at the dense optimum, within {bar:.4f})"


def _moves_verdict(optima: list[dict]) -> str:
    positions = [o["position"] for o in optima if o["position"] != "reference"]
    if len(optima) < 2:
        return "one p_max only: no verdict"
    if any(p.startswith("moves") for p in positions):
        return "the optimum moves with p_max"
    if all(p == "same" for p in positions):
        return "the optimum stays put across p_max"
    if all(p == "same" or p.startswith("tied") for p in positions):
        return "the optimum stays put across p_max within the noise"
    return "undecided"


# ------------------------------------------------------------------ instability
def rising_validation(results: list[RunResult]) -> list[dict]:
    """Runs whose validation loss rose between two evaluations during training."""
    flagged = []
    for run in results:
        steps, losses = run.curve.get("step", []), run.curve.get("val_loss", [])
        rises = [{"from_step": steps[i], "to_step": steps[i + 1], "from": losses[i], "to": losses[i + 1]}
                 for i in range(len(losses) - 1)
                 if not math.isfinite(losses[i + 1]) or losses[i + 1] > losses[i] + RISE_TOLERANCE]
        if rises:
            flagged.append({"run": run.name, "label": run.label, "rises": rises})
    return flagged


# ------------------------------------------------------------------------ plots
def curves_figure(found: list[dict], key: str):
    """Loss vs one hyperparameter (log x), a line per series, its seeds' range as a band,
    the optimum starred."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for index, curve in enumerate(found):
        points = [p for p in curve["points"] if math.isfinite(p["mean"])]
        xs = [p["value"] for p in points]
        line, = ax.plot(xs, [p["mean"] for p in points], marker=MARKERS[index % len(MARKERS)], label=curve["label"])
        if any(p["seeds"] > 1 for p in points):
            ax.fill_between(xs, [p["min"] for p in points], [p["max"] for p in points], alpha=0.2,
                            color=line.get_color())
        best = curve["points"][curve["optimum_index"]]
        ax.plot([best["value"]], [best["mean"]], marker="*", markersize=14, color=line.get_color())
    ax.set_xscale("log")
    ax.set_xlabel(f"{HYPERPARAMETERS.get(key, key)} ({key})")
    ax.set_ylabel("held-out loss (mean over seeds; band: their range)")
    ax.set_title(f"loss vs {HYPERPARAMETERS.get(key, key)}: ★ the optimum of each series")
    ax.legend(fontsize=7)
    return fig


def hyperparameter_report(results: list[RunResult], sigma: float | None = None) -> dict:
    """Everything above, for report.json; ``sigma``: the page's seed noise (pooled over every
    configuration, as the rest of the page judges), else pooled over the curves' points."""
    by_key = swept_curves(results)
    table = transfer_table(by_key.get("model.parametrization.lr", []), base_shape_of(results),
                           shared_value(results, KIND))
    return {"curves": by_key, "transfer": table, "transfer_verdicts": transfer_verdicts(table) if table else None,
            "figure3": figure3(by_key, sigma), "rising_validation": rising_validation(results)}


__all__ = ["HYPERPARAMETERS", "curves", "swept_curves", "transfer_table", "transfer_verdicts", "base_shape_of", "figure3",
           "rising_validation", "hyperparameter_report", "varying_keys", "curves_figure"]

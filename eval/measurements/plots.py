"""PNG plots of the evaluation reports and of a sweep (matplotlib, Agg: no display needed).

Evaluation commands:
- exit curve: validation loss vs exit layer, one series per model (paper Fig. 5); a line
  joins only neighbouring exits, so exits without a value (exit adapters at a few
  layers) are markers, never a line drawn through layers that have none;
- skip plot: loss vs parameters kept for multi-layer skip sets (paper Figs 6, A.3), and
  beside it, when single layers were skipped, loss vs the layer skipped: single-layer
  sets all keep the same parameters, so on one axis they would be indistinguishable;
- coordinate check: RMS of the final residual stream vs step (paper Fig. 2).

`layerdrop report` (one colour per configuration, runs of one configuration share it):
- validation loss vs training FLOPs over training (Fig. 9, the Pareto view);
- early-exit degradation and skip degradation vs P̄ (the third claim), with Spearman's ρ;
- p(ℓ, t) heatmaps, one per distinct distribution × schedule.

Each ``*_figure`` function builds the figure (tests read its lines); ``plot_*`` saves it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the backend)
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import FuncFormatter  # noqa: E402

from framework.files.atomic_write import replacing  # noqa: E402

MARKERS = "osD^v<>pPhX*"


def save_figure(fig: Figure, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    with replacing(path) as partial:
        fig.savefig(partial, dpi=120, format=path.suffix[1:] or "png")
    plt.close(fig)
    return path


def colours(labels: Sequence[str]) -> dict[str, tuple]:
    """A distinct colour per label, in order (tab10, then tab20 for more)."""
    distinct = list(dict.fromkeys(labels))
    cmap = plt.get_cmap("tab10" if len(distinct) <= 10 else "tab20")
    return {label: cmap(i % cmap.N) for i, label in enumerate(distinct)}


def _runs_of_neighbours(layers: Sequence[int]) -> list[list[int]]:
    """[1, 2, 3, 6, 8, 9] -> [[1, 2, 3], [6], [8, 9]]: the exits a line may join."""
    runs: list[list[int]] = []
    for layer in layers:
        if runs and layer == runs[-1][-1] + 1:
            runs[-1].append(layer)
        else:
            runs.append([layer])
    return runs


# ------------------------------------------------------------------ evaluation plots
def exits_figure(reports: Sequence[dict], *, title: str = "Early exit", colour_of: dict | None = None) -> Figure:
    """Each report: {"label", "exit_loss": {"1": …}} (optionally "linestyle"; with
    "num_layers" its full-depth loss is drawn across as a reference, and with "ln_vocab"
    the uniform guess is named): a flat curve reads as robust exits only beside them."""
    fig, ax = plt.subplots(figsize=(6.8, 4.4))
    colour_of = colour_of or colours([r.get("label", "model") for r in reports])
    referenced = False
    for index, report in enumerate(reports):
        label = report.get("label", "model")
        layers = sorted(int(k) for k in report["exit_loss"])
        colour = colour_of[label]
        for part, segment in enumerate(_runs_of_neighbours(layers)):
            ax.plot(segment, [report["exit_loss"][str(k)] for k in segment], color=colour,
                    marker=MARKERS[index % len(MARKERS)], markersize=4, linestyle=report.get("linestyle", "-"),
                    label=label if part == 0 else None)
        full = report["exit_loss"].get(str(report.get("num_layers")))
        if full is not None:
            ax.axhline(full, color=colour, linestyle=":", linewidth=1)
            referenced = True
    if referenced:
        ax.plot([], [], color="grey", linestyle=":", linewidth=1, label="each model's full depth (exit L)")
    ax.set_xlabel("exit layer (blocks run)")
    guesses = {round(r["ln_vocab"], 3) for r in reports if "ln_vocab" in r}
    ax.set_ylabel("validation loss (nats/token)" + (f"; uniform guess ln V = {guesses.pop():.2f}"
                                                   if len(guesses) == 1 else ""))
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return fig


def plot_exits(reports: Sequence[dict], path: str | Path, **kwargs) -> Path:
    return save_figure(exits_figure(reports, **kwargs), path)


def skip_figure(reports: Sequence[dict], *, colour_of: dict | None = None) -> Figure:
    """Each report: {"label", "results": [{"skip_layers", "loss", "params_kept", "name"}]}.

    Left: sets of several layers (and the full model) by parameters kept; the full model
    and the "middle" family are joined by a line, alternate sets are diamonds named once,
    other sets are crosses. Right (when any): every single-layer set by the layer it skips.
    """
    singles = any(len(r["skip_layers"]) == 1 for report in reports for r in report["results"])
    fig, axes = plt.subplots(1, 2 if singles else 1, figsize=(11.5 if singles else 6.8, 4.4), squeeze=False)
    left = axes[0][0]
    colour_of = colour_of or colours([r.get("label", "model") for r in reports])
    named: set[str] = set()
    for report in reports:
        label, colour = report.get("label", "model"), colour_of[report.get("label", "model")]
        rows = sorted((r for r in report["results"] if len(r["skip_layers"]) != 1), key=lambda r: r["params_kept"])
        middle = [r for r in rows if not r["skip_layers"] or _is_middle(r["skip_layers"], report.get("num_layers"))]
        if middle:
            left.plot([r["params_kept"] for r in middle], [r["loss"] for r in middle], color=colour, marker="o",
                      markersize=3, linewidth=1, label=label)
        for r in rows:
            if r in middle:
                continue
            alternate = r.get("name", "").startswith("alternate")
            left.scatter([r["params_kept"]], [r["loss"]], marker="D" if alternate else "x", s=34 if alternate else 24,
                         color=colour, edgecolor="black" if alternate else None, zorder=3,
                         label=None if middle else label)
            if alternate and r["name"] not in named:
                named.add(r["name"])
                left.annotate(r["name"], (r["params_kept"], r["loss"]), fontsize=7, xytext=(4, 4),
                              textcoords="offset points")
        if singles:
            ones = sorted((r for r in report["results"] if len(r["skip_layers"]) == 1), key=lambda r: r["skip_layers"])
            axes[0][1].plot([r["skip_layers"][0] for r in ones], [r["loss"] for r in ones], color=colour, marker="o",
                            markersize=3, label=label)
    left.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x / 1e6:g}M"))
    left.set_xlabel("parameters kept (memory footprint)")
    left.set_ylabel("validation loss")
    left.set_title("Skipping several layers (line: the middle ones)")
    if singles:
        right = axes[0][1]
        right.set_xlabel("the one layer skipped (0 = first)")
        right.set_title("Skipping one layer")
        right.grid(alpha=0.3)
        right.xaxis.get_major_locator().set_params(integer=True)
    left.grid(alpha=0.3)
    left.legend(fontsize=7)
    return fig


def _is_middle(skip: Sequence[int], num_layers: int | None) -> bool:
    """The "middle" sweep's sets: a contiguous block centred between the kept first and last."""
    if not skip or num_layers is None or len(skip) < 2:
        return False
    start, k = skip[0], len(skip)
    return list(skip) == list(range(start, start + k)) and start == 1 + (num_layers - 2 - k) // 2


def plot_skip(reports: Sequence[dict], path: str | Path, **kwargs) -> Path:
    return save_figure(skip_figure(reports, **kwargs), path)


def plot_coord_check(report: dict, path: str | Path) -> Path:
    """report["series"]: rows {"r_train", "density", "step", "rms"}."""
    series = report["series"]
    panels = [r for r in ("one", "inverse_density") if any(s["r_train"] == r for s in series)]
    densities = sorted({s["density"] for s in series})
    cmap = plt.get_cmap("viridis")
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 4.0), sharey=True, squeeze=False)
    for ax, r_train in zip(axes[0], panels):
        for i, density in enumerate(densities):
            rows = sorted((s for s in series if s["r_train"] == r_train and s["density"] == density),
                          key=lambda s: s["step"])
            colour = cmap(i / max(1, len(densities) - 1))
            ax.plot([s["step"] for s in rows], [s["rms"] for s in rows], color=colour, marker="o",
                    markersize=3, label=f"ρ = {density:g}")
        ax.set_title("r_train = 1" if r_train == "one" else "r_train = 1/ρ")
        ax.set_xlabel("training step")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("RMS of the final residual stream")
    axes[0][-1].legend(title="layer density")
    fig.suptitle("Coordinate check")
    return save_figure(fig, path)


# ---------------------------------------------------------------------- sweep plots
def pareto_figure(curves: Sequence[dict], colour_of: dict) -> Figure:
    """Each curve: {"label", "run", "training_flops": [...], "val_loss": [...]}; the end of
    each run is a marker."""
    fig, ax = plt.subplots(figsize=(7.2, 4.6))
    seen: set[str] = set()
    for curve in curves:
        if not curve["training_flops"]:
            continue
        label = curve["label"]
        colour = colour_of[label]
        ax.plot(curve["training_flops"], curve["val_loss"], color=colour, linewidth=1, alpha=0.85,
                label=None if label in seen else label)
        ax.scatter(curve["training_flops"][-1:], curve["val_loss"][-1:], color=colour, s=14, zorder=3)
        seen.add(label)
    ax.set_xlabel("non-embedding training FLOPs executed")
    ax.set_ylabel("validation loss (during training)")
    ax.set_title("Validation loss vs training FLOPs (every run)")
    ax.grid(alpha=0.3)
    if seen:
        ax.legend(fontsize=6, ncol=2)
    return fig


def degradation_figure(points: Sequence[dict], colour_of: dict, correlations: dict) -> Figure:
    """P̄ achieved vs early-exit and skip degradation, one point per run; one legend below."""
    keys = [k for k in ("exit_degradation", "skip_degradation") if any(p.get(k) is not None for p in points)]
    fig, axes = plt.subplots(1, max(1, len(keys)), figsize=(5.6 * max(1, len(keys)), 5.2), squeeze=False,
                             layout="constrained")
    titles = {"exit_degradation": "early exit: mean over exits 1..L-1 of loss - loss at L",
              "skip_degradation": "layer skipping: mean over skip sets of loss - full loss"}
    handles: dict[str, object] = {}
    for ax, key in zip(axes[0], keys):
        for point in (p for p in points if p.get(key) is not None):
            label = point["configuration"]
            handles[label] = ax.scatter([point["mean_dropout_achieved"]], [point[key]], color=colour_of[label], s=28,
                                        marker=MARKERS[list(colour_of).index(label) % len(MARKERS)],
                                        edgecolor="black", linewidth=0.4)
        rho = correlations.get(key, {}).get("spearman")
        ax.set_title(titles[key] + (f"\nSpearman ρ = {rho:+.2f}" if rho is not None else ""), fontsize=9)
        ax.set_xlabel("P̄ achieved (share of block FLOPs dropped)")
        ax.set_ylabel("loss increase (nats)")
        ax.grid(alpha=0.3)
    ordered = [label for label in colour_of if label in handles]
    fig.legend([handles[label] for label in ordered], ordered, loc="outside lower center", ncol=4, fontsize=7)
    return fig


def heatmap_figure(maps: Sequence[dict]) -> Figure:
    """Each map: {"title", "rates": [[p_(ℓ,t) for t] for ℓ], "steps"} (layers × steps)."""
    columns = min(4, max(1, len(maps)))
    rows = (len(maps) + columns - 1) // columns
    fig, axes = plt.subplots(rows, columns, figsize=(3.6 * columns + 1.2, 3.0 * rows), squeeze=False,
                             layout="constrained")
    top = max((max(map(max, m["rates"])) for m in maps), default=1.0) or 1.0
    for ax, item in zip(axes.flat, maps):
        layers = len(item["rates"])
        image = ax.imshow(item["rates"], aspect="auto", origin="lower", cmap="magma", vmin=0, vmax=top,
                          interpolation="nearest",
                          extent=(0, item.get("steps", len(item["rates"][0])), -0.5, layers - 0.5))
        ax.set_title(item["title"], fontsize=8)
        ax.set_xlabel("optimizer step t", fontsize=7)
        ax.set_ylabel("layer ℓ", fontsize=7)
        ax.set_yticks(range(0, layers, max(1, layers // 6)))
        ax.tick_params(labelsize=6)
    for ax in list(axes.flat)[len(maps):]:
        ax.axis("off")
    fig.colorbar(image, ax=axes.ravel().tolist(), shrink=0.8, label="p(ℓ, t)")
    return fig


def save(build: Callable[..., Figure], path: str | Path, *args, **kwargs) -> Path:
    """Build a figure and save it (figures laid out by matplotlib's constrained layout keep it)."""
    fig = build(*args, **kwargs)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if fig.get_layout_engine() is None:
        fig.tight_layout()
    with replacing(path) as partial:
        fig.savefig(partial, dpi=120, format=path.suffix[1:] or "png")
    plt.close(fig)
    return path


__all__ = ["save_figure", "plot_exits", "plot_skip", "plot_coord_check", "exits_figure", "skip_figure", "pareto_figure",
           "degradation_figure", "heatmap_figure", "colours", "save"]

"""PNG plots of the evaluation reports (matplotlib, Agg backend: no display needed).

- exit curve: validation loss vs exit layer, one line per checkpoint (paper Fig. 5);
- skip curve: validation loss vs parameters kept, one series per checkpoint
  (paper Figs 6 and A.3, "memory footprint" axis);
- coordinate check: RMS of the final residual stream vs training step, one panel per
  r_train, one line per layer density (paper Fig. 2).
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the backend)
from matplotlib.ticker import FuncFormatter  # noqa: E402


def _save(fig, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_exits(reports: Sequence[dict], path: str | Path) -> Path:
    """Each report: {"label", "exit_loss": {"1": …}}."""
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for report in reports:
        layers = sorted(int(k) for k in report["exit_loss"])
        losses = [report["exit_loss"][str(k)] for k in layers]
        ax.plot(layers, losses, marker="o", markersize=3, label=report.get("label", "model"))
    ax.set_xlabel("exit layer (blocks run)")
    ax.set_ylabel("validation loss")
    ax.set_title("Early exit")
    ax.grid(alpha=0.3)
    ax.legend()
    return _save(fig, path)


def plot_skip(reports: Sequence[dict], path: str | Path) -> Path:
    """Each report: {"label", "results": [{"skip_layers", "loss", "params_kept", "name"}]}.

    Points are the skip sets; the line joins each model's best loss per parameter
    count (its frontier); alternating sets are drawn as diamonds, named once.
    """
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    named: set[str] = set()
    for report in reports:
        rows = sorted(report["results"], key=lambda r: r["params_kept"])
        scatter = ax.scatter([r["params_kept"] for r in rows], [r["loss"] for r in rows], s=14, alpha=0.6,
                             label=report.get("label", "model"))
        colour = scatter.get_facecolor()[0]
        best: dict[int, float] = {}
        for r in rows:
            best[r["params_kept"]] = min(r["loss"], best.get(r["params_kept"], float("inf")))
        ax.plot(list(best), list(best.values()), color=colour, linewidth=1)
        for r in rows:
            if r.get("name", "").startswith("alternate"):
                ax.scatter([r["params_kept"]], [r["loss"]], marker="D", s=36, color=colour, edgecolor="black")
                if r["name"] not in named:
                    named.add(r["name"])
                    ax.annotate(r["name"], (r["params_kept"], r["loss"]), fontsize=7, xytext=(4, 4),
                                textcoords="offset points")
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x / 1e6:g}M"))
    ax.set_xlabel("parameters kept (memory footprint)")
    ax.set_ylabel("validation loss")
    ax.set_title("Intermediate layer skipping")
    ax.grid(alpha=0.3)
    ax.legend()
    return _save(fig, path)


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
    return _save(fig, path)


__all__ = ["plot_exits", "plot_skip", "plot_coord_check"]

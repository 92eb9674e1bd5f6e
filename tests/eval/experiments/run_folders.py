"""Hand-made run folders, as `layerdrop sweep` leaves them, whose numbers a test knows by hand."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import yaml

LAYERS, STEPS = 4, 100
SLICES = 4


def write_run(root: Path, name: str, seed: int, losses: list[float], *, exits: dict | None = None,
              skip: list[dict] | None = None, speedup: float | None = None, early_exit_loss: dict | None = None,
              exit_drafts: dict[int, float] | None = None, steps: int = STEPS, settings: dict | None = None,
              **dropout) -> None:
    """A finished run as `layerdrop sweep` leaves it: config, summary, status, evals
    (``exit_drafts``: exit layer -> the speedup of its `speculate run` report; ``steps``: its
    trainer.max_steps, its training FLOPs in proportion; ``settings``: other config sections'
    values, e.g. {"model": {"parametrization": {"lr": 0.004}}})."""
    folder = root / "runs" / name
    (folder / "evals").mkdir(parents=True)
    layer_dropout = {"p_max": 0.0, "distribution": "increasing", "schedule": "decreasing", "structure": "layer",
                     "mask": "sequence", "r_train": "inverse_density", "seed": seed, **dropout}
    config = {"seed_everything": seed, "trainer": {"max_steps": steps, "default_root_dir": str(folder)},
              "model": {"decoder": {"n_layers": LAYERS, "d_model": 32}, "layer_dropout": layer_dropout},
              "data": {"seed": seed, "data_dir": "/data"}}
    merge(config, settings or {})
    if early_exit_loss is not None:
        config["model"]["early_exit_loss"] = early_exit_loss
    (folder / "config.yaml").write_text(yaml.safe_dump(config))
    p_bar = {"constant": 1.0, "increasing": 0.5, "decreasing": 0.5}[layer_dropout["schedule"]] * \
        {"uniform": 1.0, "increasing": 0.5, "alternating": 0.5}[layer_dropout["distribution"]] * layer_dropout["p_max"]
    scale = steps / STEPS
    (folder / "summary.json").write_text(json.dumps({
        "steps": steps, "tokens": int(1000 * scale), "val_loss": statistics.fmean(losses) + 0.01, "ln_vocab": 5.0,
        "training_flops": 1e12 * scale * (1 - p_bar), "dense_training_flops": 1e12 * scale,
        "flops_saved_pct": 100 * p_bar, "mean_dropout_predicted": p_bar}))
    (folder / "status.json").write_text(json.dumps({"state": "done", "stages": {"pretrain": {"cpu_seconds": 10.0}}}))
    exits = exits or {str(k): statistics.fmean(losses) + (LAYERS - k) * 0.5 for k in range(1, LAYERS + 1)}
    heldout = {"num_layers": LAYERS, "exit_loss": exits, "tokens": 4000, "loss": exits[str(LAYERS)],
               "standard_error": {k: 0.01 for k in exits},
               "groups": {"tokens": [1000] * SLICES, "exit_loss": {k: [v + d for d in losses_offsets(losses, v)]
                                                                   for k, v in exits.items()}}}
    heldout["exit_loss"][str(LAYERS)] = heldout["loss"] = statistics.fmean(losses)
    heldout["groups"]["exit_loss"][str(LAYERS)] = losses
    (folder / "evals" / "heldout.json").write_text(json.dumps(heldout))
    if skip is not None:
        (folder / "evals" / "skip.json").write_text(json.dumps({"num_layers": LAYERS, "results": skip}))
    if speedup is not None:
        (folder / "evals" / "speculate.json").write_text(json.dumps({"best": {
            "speedup": speedup, "acceptance_rate": 0.5, "draft_time_ratio": 0.5, "skip_layers": [2],
            "identical_to_greedy": True}}))
    for exit_layer, draft_speedup in (exit_drafts or {}).items():
        (folder / "evals" / f"exit-draft-{exit_layer}.json").write_text(json.dumps({
            "draft": "exit", "exit_layer": exit_layer, "skip_layers": [], "speedup": draft_speedup,
            "acceptance_rate": 0.5, "identical_to_greedy": True}))


def losses_offsets(losses: list[float], mean: float) -> list[float]:
    return [x - statistics.fmean(losses) for x in losses]


def slices(mean: float, spread: float = 0.002) -> list[float]:
    return [mean - 1.5 * spread, mean - 0.5 * spread, mean + 0.5 * spread, mean + 1.5 * spread]


def skip_rows(full: float, odd: float) -> list[dict]:
    return [{"skip_layers": [], "loss": full, "params_kept": 100, "name": "none"},
            {"skip_layers": [1, 3], "loss": odd, "params_kept": 60, "name": "alternate-odd"},
            {"skip_layers": [2], "loss": full + 0.3, "params_kept": 80, "name": "2"}]


def merge(config: dict, settings: dict) -> None:
    """``settings`` into ``config``, section by section."""
    for key, value in settings.items():
        if isinstance(value, dict) and isinstance(config.get(key), dict):
            merge(config[key], value)
        else:
            config[key] = value

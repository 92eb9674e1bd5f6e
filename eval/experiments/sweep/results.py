"""What a sweep folder holds, read back: one record per run, and its configuration's label.

A run folder (written by `layerdrop sweep`) holds config.yaml, summary.json, status.json,
evals/*.json and the TensorBoard logs of training. ``load_results`` reads every run into
a ``RunResult``; the validation curve (val/loss against the training FLOPs executed up to
that step) comes from the TensorBoard events, or from curve.json in a copied folder.
``copy_results`` writes the small files (no checkpoint, no event file) to another folder
with the same layout, so a report can be rebuilt from a committed copy alone.

Configurations are labelled by what they are, not by run or file names: the layer
dropout in the paper's words (``dense``, ``ILD+DTS p_max=0.4``, ``uniform p_max=0.2``,
``ILD+DTS p_max=0.8, sublayer``), plus any other setting that differs between the
sweep's configurations (``lr=0.006``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from eval.experiments.sweep.spec import (DEFAULT_SEED_KEYS, EvalSpec, SweepError, get_dotted, load_sweep, parse_evals,
                                         predict)
from framework.config import LayerDropoutConfig
from framework.files.atomic_write import write_text

SMALL_FILES = ("config.yaml", "recipe.yaml", "summary.json", "status.json", "curve.json")
IGNORED_KEYS = (*DEFAULT_SEED_KEYS, "trainer.default_root_dir", "data.data_dir", "summary.compare_to",
                "resume", "trainer.enable_progress_bar")
DISTRIBUTION_NAMES = {"uniform": "uniform", "increasing": "ILD", "alternating": "ALD"}
SCHEDULE_NAMES = {"constant": "", "increasing": "+ITS", "decreasing": "+DTS"}
# What a recipe leaves out of model.layer_dropout is LayerDropoutConfig's default.
LAYER_DROPOUT_DEFAULTS = {entry.name: entry.default for entry in fields(LayerDropoutConfig)}


@dataclass
class RunResult:
    name: str
    folder: Path
    config: dict
    summary: dict
    status: dict
    evals: dict[str, dict] = field(default_factory=dict)
    curve: dict[str, list[float]] = field(default_factory=dict)  # step, flops, val_loss
    label: str = ""
    seed: int | None = None
    matched_to: list[str] = field(default_factory=list)  # a compute-matched run: the runs whose FLOPs it matches
    matched_on: list[str] = field(default_factory=list)  # ... in which convention: "non-embedding", "total"

    @property
    def layer_dropout(self) -> dict:
        return dict(get_dotted(self.config, "model.layer_dropout") or {})

    @property
    def num_layers(self) -> int:
        return int(get_dotted(self.config, "model.decoder.n_layers"))

    @property
    def dense(self) -> bool:
        dropout = self.layer_dropout
        if isinstance(dropout.get("distribution"), list):
            return not any(p > 0 for p in dropout["distribution"])
        return float(dropout.get("p_max", LAYER_DROPOUT_DEFAULTS["p_max"])) == 0.0

    @property
    def cpu_seconds(self) -> float:
        # an attempt the sweep never reaped (it was killed) counts with what its meter last saw
        return sum(stage.get("cpu_seconds", 0.0) + (stage.get("in_flight") or {}).get("cpu_seconds", 0.0)
                   for stage in self.status.get("stages", {}).values())

    def eval_with(self, key: str) -> dict | None:
        """The first evaluation report holding ``key`` (heldout before exits: more tokens).
        `eval downstream` reports hold lm-eval's "results" and "groups" under names ours use
        too: they answer only for a key of lm-eval's own ("lm_eval_version")."""
        for name in sorted(self.evals, key=lambda n: (n != "heldout", n)):
            report = self.evals[name]
            if key in report and (("lm_eval_version" in report) == (key == "lm_eval_version")):
                return report
        return None

    @property
    def val_loss(self) -> float | None:
        """The comparison loss: the held-out evaluation's when the sweep ran one, else the
        end-of-training validation."""
        heldout = self.eval_with("loss")
        if heldout is not None and "groups" in heldout:
            return float(heldout["loss"])
        value = self.summary.get("val_loss")
        return None if value is None else float(value)

    @property
    def exit_loss(self) -> dict[int, float] | None:
        report = self.eval_with("exit_loss")
        return None if report is None else {int(k): float(v) for k, v in report["exit_loss"].items()}


# --------------------------------------------------------------------------- loading
def run_folders(root: Path) -> list[Path]:
    runs = root / "runs"
    if not runs.is_dir():
        raise FileNotFoundError(f"{str(root)!r} is not a sweep folder: it has no runs/ (made by `layerdrop sweep`)")
    return sorted(p for p in runs.iterdir() if p.is_dir() and not p.name.startswith("."))


def load_results(root: Path) -> tuple[list[RunResult], list[str]]:
    """Every finished run (its summary.json and every evaluation its sweep asks of it), and
    a line for each run left out (a folder unfinished or failed, or a run its sweep.yaml plans that
    has not started). A run trained but not yet evaluated is left out, not
    compared by its end-of-training validation beside the others' held-out loss."""
    results, skipped = [], []
    asked = asked_evaluations(root)
    folders = run_folders(root)
    for folder in folders:
        config_file = folder / "config.yaml"
        if not (folder / "summary.json").is_file() or not config_file.is_file():
            status = _json(folder / "status.json") or {}
            skipped.append(f"{folder.name}: {status.get('state', 'not started')}"
                           + (f" ({status['error']})" if status.get("error") else ""))
            continue
        pending = [spec.name for spec in asked
                   if spec.applies_to(folder.name) and not (folder / "evals" / f"{spec.name}.json").is_file()]
        if pending:
            status = _json(folder / "status.json") or {}
            skipped.append(f"{folder.name}: trained, evaluations pending: {', '.join(pending)}"
                           + (f" ({status['error']})" if status.get("error") else ""))
            continue
        evals = {p.stem: _json(p) for p in sorted((folder / "evals").glob("*.json"))}
        result = RunResult(name=folder.name, folder=folder, config=yaml.safe_load(config_file.read_text()),
                           summary=_json(folder / "summary.json"), status=_json(folder / "status.json") or {},
                           evals={k: v for k, v in evals.items() if isinstance(v, dict)})
        result.seed = get_dotted(result.config, "seed_everything")
        result.curve = _json(folder / "curve.json") or tensorboard_curve(folder)
        results.append(result)
    made = {folder.name for folder in folders}
    skipped += [f"{name}: not started" for name in planned_runs(root) if name not in made]
    mark_compute_matched(results)
    label_configurations(results)
    return results, skipped


def planned_runs(root: Path) -> list[str]:
    """The run folders the folder's sweep.yaml plans (a sweep makes a run's folder only when it
    starts it); none where there is no sweep.yaml or it cannot be read here (its base recipe
    lies elsewhere), so a report of a copied folder lists only the folders it holds."""
    if not (root / "sweep.yaml").is_file():
        return []
    try:
        return [run.name for run in load_sweep(root / "sweep.yaml").runs]
    except (SweepError, OSError):
        return []


def asked_evaluations(root: Path) -> list[EvalSpec]:
    """The evaluations the folder's sweep file (sweep.yaml, or tune.yaml of `layerdrop tune`)
    asks of its runs; none when it has no such file (a folder of runs alone)."""
    for name in ("sweep.yaml", "tune.yaml"):
        if (root / name).is_file():
            spec = yaml.safe_load((root / name).read_text()) or {}
            return parse_evals(spec.get("evals") or []) if isinstance(spec, dict) else []
    return []


def _json(path: Path) -> Any:
    return json.loads(path.read_text()) if path.is_file() else None


def tensorboard_curve(folder: Path) -> dict[str, list[float]]:
    """val/loss at each validation against the non-embedding training FLOPs executed up to
    that step (from the cumulative flops/saved_pct and the constant flops/dense_step).
    A resumed run logs into several version folders; later ones win for a step."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    series: dict[str, dict[int, float]] = {"val/loss": {}, "flops/saved_pct": {}, "flops/dense_step": {}}
    versions = sorted((folder / "lightning_logs").glob("version_*"), key=lambda p: int(p.name.split("_")[-1]))
    for version in versions:
        events = EventAccumulator(str(version), size_guidance={"scalars": 0})
        events.Reload()
        tags = set(events.Tags().get("scalars", []))
        for tag, values in series.items():
            if tag in tags:
                values.update({e.step: float(e.value) for e in events.Scalars(tag)})
    dense = series["flops/dense_step"]
    saved = sorted(series["flops/saved_pct"].items())
    if not dense or not saved:
        return {}
    per_step = next(iter(dense.values()))
    steps, flops, losses = [], [], []
    for step, loss in sorted(series["val/loss"].items()):
        pct = _interpolate(saved, step)
        steps.append(step + 1)  # logged at step t = optimizer steps done - 1
        flops.append(per_step * (step + 1) * (1 - pct / 100))
        losses.append(loss)
    return {"step": steps, "training_flops": flops, "val_loss": losses}


def _interpolate(points: list[tuple[int, float]], x: int) -> float:
    if x <= points[0][0]:
        return points[0][1]
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if x0 <= x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0) if x1 > x0 else y1
    return points[-1][1]


# ------------------------------------------------------------------ compute-matched
def mark_compute_matched(results: list[RunResult]) -> None:
    """Find the compute-matched baselines by what they are (eval/experiments/sweep/compute_matched.py
    makes them): a run equal to longer runs in every setting but its length (LENGTH_KEYS),
    whose predicted FLOPs equal, within one of its steps, those of runs with layer dropout
    that are equal to the longer runs in every setting but the layer dropout. FLOPs are
    counted either way a sweep may match them: non-embedding (the blocks, from summary.json)
    or total (the unembedding and early-exit heads too, predicted from the config). Sets
    ``matched_to`` to those runs' names and ``matched_on`` to the conventions they match in."""
    flats = {r.name: {k: v for k, v in flatten(r.config).items() if k not in IGNORED_KEYS} for r in results}
    rest = {name: _without(flat, LENGTH_KEYS) for name, flat in flats.items()}
    outside_dropout = {name: _without(flat, (), "model.layer_dropout.") for name, flat in flats.items()}
    counts: dict[str, dict[str, float | None]] = {}
    for run in results:
        run.matched_to = []
        steps = int(run.summary.get("steps") or 0)
        references = [r for r in results if rest[r.name] == rest[run.name] and int(r.summary.get("steps") or 0) > steps]
        if not steps or not references:
            continue
        candidates = [target for reference in references for target in results
                      if not target.dense and outside_dropout[target.name] == outside_dropout[reference.name]]
        for name in {run.name, *(t.name for t in candidates)}:
            if name not in counts:
                counts[name] = flops_counts(next(r for r in results if r.name == name))
        mine = counts[run.name]

        def equal(target: str, key: str) -> bool:
            return mine[key] is not None and counts[target][key] is not None \
                and abs(mine[key] - counts[target][key]) <= mine[key] / steps * (1 + 1e-6)

        run.matched_to = sorted({t.name for t in candidates if any(equal(t.name, k) for k in mine)})
        run.matched_on = [k.replace("_", "-") for k in mine if any(equal(t, k) for t in run.matched_to)]


LENGTH_KEYS = ("trainer.max_steps", "trainer.val_check_interval", "checkpoint.every_n_steps")


def flops_counts(run: RunResult) -> dict[str, float | None]:
    """A run's predicted training FLOPs, both counts: non-embedding (the blocks: summary.json's
    dense FLOPs × (1 − P̄ predicted)) and total (the unembedding and early-exit heads too,
    `layerdrop sweep`'s prediction from the config; None for a config it cannot predict)."""
    summary = run.summary
    non_embedding = float(summary["dense_training_flops"]) * (1 - float(summary["mean_dropout_predicted"])) \
        if "dense_training_flops" in summary and "mean_dropout_predicted" in summary else None
    try:
        total = predict(run.config).training_flops
    except (ValueError, TypeError, KeyError):
        total = None
    return {"non_embedding": non_embedding, "total": total}


FLOP_KEYS = ("non_embedding_training_flops", "dense_non_embedding_training_flops", "total_training_flops",
             "dense_total_training_flops")


def flop_conventions(run: RunResult) -> dict[str, float | None]:
    """What a run executed, both conventions, each with its dense twin (framework/training/callbacks.py's
    names). A summary.json written before they were named holds the blocks only (``training_flops``):
    the non-embedding figures are those, and the total adds the unembedding and early-exit heads its
    recipe runs (`layerdrop sweep`'s prediction, scaled to the tokens trained), or is None where the
    recipe cannot be predicted. ``total_from``: "summary", "recipe" or None."""
    summary = run.summary
    if all(key in summary for key in FLOP_KEYS):
        return {**{key: float(summary[key]) for key in FLOP_KEYS}, "total_from": "summary"}
    blocks, dense = float(summary["training_flops"]), float(summary["dense_training_flops"])
    found = {"non_embedding_training_flops": blocks, "dense_non_embedding_training_flops": dense,
             "total_training_flops": None, "dense_total_training_flops": None, "total_from": None}
    try:
        predicted = predict(run.config)
    except (ValueError, TypeError, KeyError):
        return found
    head = predicted.head_flops * float(summary.get("tokens") or predicted.tokens) / predicted.tokens
    return {**found, "total_training_flops": blocks + head * (1 + predicted.exit_heads),
            "dense_total_training_flops": dense + head, "total_from": "recipe"}


def _without(flat: dict[str, Any], keys: tuple[str, ...], prefix: str | None = None) -> dict[str, Any]:
    return {k: v for k, v in flat.items() if k not in keys and not (prefix and k.startswith(prefix))}


# --------------------------------------------------------------------------- labels
def dropout_label(dropout: dict) -> str:
    """The layer dropout in the paper's words."""
    dropout = {**LAYER_DROPOUT_DEFAULTS, **dropout}
    distribution, p_max = dropout["distribution"], float(dropout["p_max"])
    if isinstance(distribution, list):
        base = "per-layer [" + ", ".join(f"{p:g}" for p in distribution) + "]"
        if not any(p > 0 for p in distribution):
            return "dense"
    elif p_max == 0.0:
        return "dense"
    else:
        base = f"{DISTRIBUTION_NAMES.get(distribution, distribution)}" \
               f"{SCHEDULE_NAMES.get(dropout['schedule'], '+' + str(dropout['schedule']))}" \
               f" p_max={p_max:g}"
    extras = []
    if dropout["structure"] != "layer":
        extras.append(str(dropout["structure"]))
    if dropout["mask"] != "sequence":
        extras.append("per-batch" if dropout["mask"] == "batch" else f"mask={dropout['mask']}")
    if dropout["r_train"] != "inverse_density":
        extras.append("r_train=1" if dropout["r_train"] == "one" else f"r_train={dropout['r_train']}")
    return ", ".join([base, *extras])


def flatten(config: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(config, dict):
        return {prefix: config}
    flat: dict[str, Any] = {}
    for key, value in config.items():
        flat.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    return flat


def configuration_key(config: dict) -> str:
    """What identifies a configuration: every setting but the seeds and the run's paths."""
    flat = flatten(config)
    return json.dumps({k: v for k, v in sorted(flat.items()) if k not in IGNORED_KEYS}, sort_keys=True, default=str)


def label_configurations(results: list[RunResult]) -> None:
    """Label each run by its layer dropout, plus the other settings that vary in the sweep.

    A key only some runs' configs have (a setting added to the schema after the older runs were
    made, adopted from a committed report) varies only if the runs that have it disagree: its
    absence is not a value, or every adopted run's label would list every newer setting."""
    flats = [flatten(r.config) for r in results]
    # A compute-matched run's length differs from the others' by design: it labels it, not them.
    judged = [flat for flat, r in zip(flats, results) if not r.matched_to] or flats
    keys = sorted({k for flat in flats for k in flat})
    varying = [k for k in keys if k not in IGNORED_KEYS and not k.startswith(("model.layer_dropout.",
                                                                               "model.early_exit_loss."))
               and len({json.dumps(flat[k], default=str) for flat in judged if k in flat}) > 1]
    for result, flat in zip(results, flats):
        extras = [f"{k.split('.')[-1]}={flat[k]}" for k in varying if k in flat]
        exits = early_exit_label(get_dotted(result.config, "model.early_exit_loss") or {})
        if result.matched_to:
            extras.append(f"{result.summary.get('steps')} steps (compute-matched)")
        result.label = ", ".join([dropout_label(result.layer_dropout) + exits, *extras])


def early_exit_label(section: dict) -> str:
    """`` + early-exit loss 0.5 (rotational 3, uniform)``, or "" when the loss is off."""
    if not float(section.get("scale", 0.0)):
        return ""
    curriculum = section.get("curriculum", "none")
    knob = {"rotational": f" {section.get('rotation', 2)}", "gradual": f" over {section.get('ramp', 1.0):g}"}
    exits = section.get("exits", "all")
    which = f"exits {exits}" if exits != "all" else ("" if section.get("every", 1) == 1 else f"every {section['every']}")
    details = [d for d in (which, f"{curriculum}{knob.get(curriculum, '')}" if curriculum != "none" else "",
                           section.get("weighting", "uniform")) if d]
    return f" + early-exit loss {float(section['scale']):g} ({', '.join(details)})"


# --------------------------------------------------------------------------- copying
def copy_results(results: list[RunResult], destination: Path, sweep_file: Path | None,
                 aliases: dict[str, str] | None = None) -> None:
    """The small files of every run (+ curve.json and the sweep file) under ``destination``,
    with each path in ``aliases`` written as its alias (a committed copy names no machine's
    folders)."""
    def copy(source: Path, target: Path) -> None:
        write_text(target, with_aliases(source.read_text(), aliases))

    for result in results:
        target = destination / "runs" / result.name
        if target.resolve() == result.folder.resolve():
            continue
        (target / "evals").mkdir(parents=True, exist_ok=True)
        for name in SMALL_FILES:
            if (result.folder / name).is_file():
                copy(result.folder / name, target / name)
        for path in (result.folder / "evals").glob("*.json"):
            copy(path, target / "evals" / path.name)
        write_text(target / "curve.json", json.dumps(result.curve, indent=1) + "\n")
    if sweep_file is not None and sweep_file.is_file() and sweep_file.resolve() != (destination / "sweep.yaml").resolve():
        copy(sweep_file, destination / "sweep.yaml")


def with_aliases(text: str, aliases: dict[str, str] | None) -> str:
    """``text`` with every path of ``aliases`` replaced by its alias (longest paths first)."""
    for path in sorted(aliases or {}, key=len, reverse=True):
        text = text.replace(path, aliases[path])
    return text


__all__ = ["RunResult", "load_results", "planned_runs", "mark_compute_matched", "flops_counts", "FLOP_KEYS",
           "flop_conventions",
           "LENGTH_KEYS", "tensorboard_curve",
           "dropout_label", "label_configurations",
           "LAYER_DROPOUT_DEFAULTS", "configuration_key", "copy_results", "with_aliases", "flatten"]

"""Evaluation per source of a data mixture: which folders `eval exits|skip|heldout` read,
and how each source's report and the mixture's combine.

    --data DIR                         one folder (as before)
    --data code=DIR prose=DIR          several, named (equal weights)
    --mixture RUN/config.yaml          a recipe's or a run's data.mixture: names, folders, weights

Each source is evaluated on its own validation split; the report keeps each source's
curve under "sources" and puts the mixture's (Σ weight × the source's loss, per exit or per
skip set) at the top level, so a reader sees depth elasticity per domain: whether layer
dropout keeps code's early exits as good as prose's.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import yaml

from framework.training.data.mixture import parse_mixture

LINESTYLES = ("-", "--", ":", "-.")


@dataclass(frozen=True)
class EvalSource:
    name: str
    dir: str
    weight: float


def add_data(parser: argparse.ArgumentParser) -> None:
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--data", nargs="+", action="extend", default=None, metavar="[NAME=]DIR",
                       help="folder(s) made by `layerdrop prepare`, their validation splits used; several "
                            "(NAME=DIR) are each reported on their own and as an equal-weight mixture")
    group.add_argument("--mixture", default=None, metavar="YAML",
                       help="a recipe or a run's config.yaml whose data.mixture names the sources and their "
                            "weights: each source reported on its own and the mixture weighted as in training")


def resolve(parser: argparse.ArgumentParser, data: Sequence[str] | None, mixture: str | None) -> list[EvalSource]:
    """The sources asked for (a one-line parser error for a bad entry)."""
    try:
        if mixture is not None:
            spec = _mixture_of(mixture)
        else:
            spec = {}
            for index, entry in enumerate(data or []):
                name, sep, folder = entry.partition("=")
                name, folder = (name, folder) if sep and "/" not in name else (_default_name(entry, index), entry)
                if name in spec:
                    raise ValueError(f"--data {entry!r} is invalid: the source name {name!r} is given twice")
                spec[name] = {"dir": folder, "weight": 1.0}
        return [EvalSource(s.name, s.dir, s.weight) for s in parse_mixture(spec)]
    except ValueError as err:
        parser.error(str(err) if mixture is not None else str(err).replace("data.mixture.", "--data source "))


def _default_name(folder: str, index: int) -> str:
    name = Path(folder.rstrip("/")).name
    return name if name and name[0].isalnum() else f"source{index + 1}"


def _mixture_of(path: str) -> dict:
    try:
        with open(path) as handle:
            recipe = yaml.safe_load(handle)
    except (OSError, yaml.YAMLError) as err:
        raise ValueError(f"--mixture {path!r} cannot be read: {type(err).__name__}") from None
    mixture = (recipe or {}).get("data", {}).get("mixture") if isinstance(recipe, dict) else None
    if not mixture:
        raise ValueError(f"--mixture {path!r} is invalid: it has no data.mixture section")
    return mixture


def combine(per_source: dict[str, dict], sources: Sequence[EvalSource], kind: str) -> dict[str, Any]:
    """One checkpoint's report over several sources: the mixture's curve at the top level
    (``kind``: "exits" or "skip"), each source's report under "sources"."""
    first = per_source[sources[0].name]
    weights = {source.name: source.weight for source in sources}
    report = {key: value for key, value in first.items() if key not in ("exit_loss", "results", "tokens")}
    report["tokens"] = sum(r["tokens"] for r in per_source.values())
    if kind == "exits":
        exits = first["exit_loss"].keys()
        report["exit_loss"] = {k: sum(weights[n] * r["exit_loss"][k] for n, r in per_source.items()) for k in exits}
    else:
        rows = {tuple(row["skip_layers"]): row for row in first["results"]}
        losses = {key: sum(weights[n] * _row(r, key)["loss"] for n, r in per_source.items()) for key in rows}
        report["results"] = [{**row, "loss": losses[key]} for key, row in rows.items()]
    report["sources"] = {source.name: {"dir": source.dir, "weight": source.weight, **per_source[source.name]}
                         for source in sources}
    return report


def _row(report: dict, skip: tuple) -> dict:
    return next(row for row in report["results"] if tuple(row["skip_layers"]) == skip)


def per_source_series(reports: Sequence[dict]) -> tuple[list[dict], dict[str, tuple]]:
    """The exit curve of every (checkpoint, source): one colour per checkpoint, one line
    style per source, for ``plots.exits_figure``."""
    from eval.measurements.plots import colours

    by_checkpoint = colours([r.get("label", "model") for r in reports])
    series, colour_of = [], {}
    for report in reports:
        for index, (name, source) in enumerate(report["sources"].items()):
            label = f"{report.get('label', 'model')} · {name}"
            series.append({"label": label, "exit_loss": source["exit_loss"], "num_layers": report["num_layers"],
                           "linestyle": LINESTYLES[index % len(LINESTYLES)]})
            colour_of[label] = by_checkpoint[report.get("label", "model")]
    return series, colour_of


__all__ = ["EvalSource", "add_data", "resolve", "combine", "per_source_series"]

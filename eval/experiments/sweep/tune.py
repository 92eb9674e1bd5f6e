"""`layerdrop tune TUNE.yaml --out DIR`: tune a base model by successive 1-D sweeps.

    layerdrop tune recipes/sweeps/tune-cpu.yaml --out sweeps/tune-cpu --dry-run
    layerdrop tune recipes/sweeps/tune-cpu.yaml --out sweeps/tune-cpu --jobs 2 --threads-per-job 1

A tune file is a sweep file (base, data, overrides, seeds, seed_keys, evals: see
eval/experiments/sweep/spec.py) whose ``tune`` section replaces the grid:

    tune:
      metric: heldout                 # evals/<metric>.json's "loss" decides (lower is better)
      search:                         # one stage per key, in this order
        model.parametrization.lr: [0.001, 0.002, 0.004, 0.008, 0.016]
        model.decoder.init_std: [0.01, 0.02, 0.05, 0.1]
        model.parametrization.tau_ema: [0.15, 0.3, 0.6, 1.2]
      start: {model.decoder.init_std: 0.02, model.parametrization.tau_ema: 0.6}
      confirm: {seeds: [1, 2], along: model.parametrization.lr, neighbours: 1}
      passes: 2                       # sweep the keys again through the new best point (default 1)

Stage k sweeps the k-th key over its values with every other key at the best point so
far (earlier keys at their chosen values, later ones at ``start``); its choice is the
value of lowest mean loss over the sweep's ``seeds``. The last stage (``confirm``) runs
more seeds at the optimum and its ``neighbours`` on each side along one key, and the
final choice is the lowest mean over all those seeds there: the only comparison made
on equal, several-seed footing.

One pass over the keys finds the optimum only when they do not interact; when they do
(a larger init wants a larger LR), ``passes: N`` sweeps every key again through the
best point the previous pass ended at, at most N times, and stops early once a whole
pass leaves the point where it began. Points already run are not run again.

Why a command and not a sweep kind: each stage's points depend on the previous stage's
results, so no file written in advance can list them. Every point is an ordinary sweep
run: named by all searched keys (``lr=0.002,init_std=0.02,tau_ema=0.6,seed=0``, as a
grid over those keys would name it, so a grid already run into DIR is adopted as it is
and a point two stages share is one folder), run by eval/experiments/sweep/runner.py's Runner (resumable,
locked, --jobs/--threads-per-job), and read by `layerdrop report DIR` like any sweep.
Running the command again continues where it stopped; --dry-run says what the next
stage would run and runs nothing.

Writes DIR/tune.yaml (the file as last run), DIR/tune.json (every stage, point and
loss) and DIR/tuned.yaml: the base recipe with the shared overrides and the chosen
values, headed by a comment with the command and each stage's table.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from eval.experiments.sweep.run_folder import RunFolder
from eval.experiments.sweep.runner import (Runner, add_run_options, prepare_data, record_invocation, report_adopted,
                                           run_all)
from eval.experiments.sweep.adoption import adopt_finished
from eval.experiments.sweep.spec import (Sweep, SweepError, check_keys, config_name, predict, read_spec, run_recipe,
                                         set_dotted, short_keys, sweep_of)
from eval.options import check_positive
from framework.files.atomic_write import write_json, write_text
from framework.command_parser import CommandParser

PROG = "layerdrop tune"
TUNE_KEYS = ("metric", "search", "start", "confirm", "passes")
CONFIRM_KEYS = ("seeds", "along", "neighbours")


@dataclass(frozen=True)
class Confirm:
    seeds: tuple[int, ...]
    along: str
    neighbours: int


@dataclass(frozen=True)
class TuneSpec:
    search: dict[str, list[Any]]  # key -> values, in stage order
    start: dict[str, Any]
    metric: str
    confirm: Confirm | None
    seeds: tuple[int, ...]  # the sweep's seeds: every point of every stage runs these
    labels: dict[str, str] = field(default_factory=dict)  # key -> its short name in run names
    passes: int = 1  # the most sweeps over the keys (stopping early when one moves nothing)


@dataclass
class Point:
    values: dict[str, Any]  # every searched key, in search order
    seeds: tuple[int, ...]
    losses: dict[int, float] = field(default_factory=dict)  # seed -> loss (inf: diverged)
    states: dict[int, str] = field(default_factory=dict)  # seed -> run state

    @property
    def mean(self) -> float | None:
        if len(self.losses) < len(self.seeds):
            return None
        return statistics.fmean(self.losses.values()) if all(map(math.isfinite, self.losses.values())) \
            else math.inf

    @property
    def std(self) -> float | None:
        values = list(self.losses.values())
        return statistics.stdev(values) if len(values) > 1 and all(map(math.isfinite, values)) else None


@dataclass
class Stage:
    title: str
    key: str  # the key this stage varies
    points: list[Point]
    chosen: Point | None = None
    final: bool = False  # the last stage the plan has: its choice is the result

    @property
    def complete(self) -> bool:
        return all(p.mean is not None for p in self.points)


# ----------------------------------------------------------------------- parsing
def load_tune(path: str | Path, *, data_dir: str | None = None) -> tuple[TuneSpec, dict, str]:
    """The tune section, checked, plus the file's mapping and text (for the sweeps)."""
    spec, text = read_spec(path)
    section = spec.get("tune")
    if not isinstance(section, dict):
        raise SweepError(f"tune file {str(path)!r} has no tune section: expected tune: {{metric, search, start, "
                         "confirm}}")
    if spec.get("grid") or spec.get("runs"):
        raise SweepError("a tune file plans its runs from tune.search: remove grid and runs")
    unknown = sorted(set(section) - set(TUNE_KEYS))
    if unknown:
        raise SweepError(f"tune keys {unknown} are invalid: allowed: {', '.join(TUNE_KEYS)}")
    search = section.get("search")
    if not isinstance(search, dict) or not search:
        raise SweepError(f"tune.search={search!r} is invalid: expected a mapping of dotted recipe keys to lists "
                         "of values (one stage per key)")
    for key, values in search.items():
        if not isinstance(values, list) or not values or len({json.dumps(v) for v in values}) != len(values):
            raise SweepError(f"tune.search.{key}={values!r} is invalid: expected a non-empty list of distinct values")
        for value in values:
            check_keys({key: value}, "tune.search")
    keys = list(search)
    start = section.get("start") or {}
    if not isinstance(start, dict) or sorted(set(start) - set(keys)):
        raise SweepError(f"tune.start={start!r} is invalid: expected values for keys of tune.search only")
    missing = [k for k in keys[1:] if k not in start]
    if missing:
        raise SweepError(f"tune.start lacks {missing}: every key after the first stage's needs a starting value")
    metric = section.get("metric", "heldout")
    names = [e.get("name") for e in spec.get("evals") or [] if isinstance(e, dict)]
    if metric != "val_loss" and metric not in names:
        raise SweepError(f"tune.metric={metric!r} is invalid: expected the name of one of the evals {names} "
                         "(its report's \"loss\") or val_loss (the end-of-training validation)")
    seeds = tuple(spec.get("seeds", [0]))
    confirm = _confirm(section.get("confirm"), keys, seeds)
    passes = section.get("passes", 1)
    if not isinstance(passes, int) or isinstance(passes, bool) or passes < 1:
        raise SweepError(f"tune.passes={passes!r} is invalid: expected an integer >= 1")
    tune = TuneSpec(search={k: list(v) for k, v in search.items()}, start={k: start.get(k) for k in keys},
                    metric=metric, confirm=confirm, seeds=seeds, labels=short_keys(keys), passes=passes)
    sweep_of(spec, Path(path), text, data_dir=data_dir, extra_keys=("tune",), configs=[])  # the shared parts' checks
    return tune, spec, text


def _confirm(value: Any, keys: list[str], seeds: tuple[int, ...]) -> Confirm | None:
    if value is None:
        return None
    if not isinstance(value, dict) or sorted(set(value) - set(CONFIRM_KEYS)):
        raise SweepError(f"tune.confirm={value!r} is invalid: expected a mapping with {', '.join(CONFIRM_KEYS)}")
    extra = value.get("seeds")
    if not isinstance(extra, list) or not all(isinstance(s, int) and s >= 0 for s in extra) or set(extra) & set(seeds):
        raise SweepError(f"tune.confirm.seeds={extra!r} is invalid: expected integers >= 0 not among the sweep's "
                         f"seeds {list(seeds)}")
    along = value.get("along", keys[0])
    if along not in keys:
        raise SweepError(f"tune.confirm.along={along!r} is invalid: expected one of tune.search's keys {keys}")
    neighbours = value.get("neighbours", 1)
    if not isinstance(neighbours, int) or neighbours < 0:
        raise SweepError(f"tune.confirm.neighbours={neighbours!r} is invalid: expected an integer >= 0")
    return Confirm(tuple(extra), along, neighbours)


# ----------------------------------------------------------------------- planning
def point_name(tune: TuneSpec, values: dict[str, Any]) -> str:
    return config_name(values, tune.labels)


def stage_points(tune: TuneSpec, index: int, best: dict[str, Any]) -> tuple[str, list[dict[str, Any]], tuple[int, ...]]:
    """Stage ``index``: (the key it varies, its points, their seeds). Stages 0..P·K-1 are
    the searched keys, pass after pass; any index past the passes is the confirmation."""
    keys = list(tune.search)
    if index < len(keys) * tune.passes:
        key = keys[index % len(keys)]
        return key, [{**best, key: value} for value in tune.search[key]], tune.seeds
    confirm = tune.confirm
    values = tune.search[confirm.along]
    at = _index(values, best[confirm.along])
    chosen = values[max(0, at - confirm.neighbours):at + confirm.neighbours + 1]
    return confirm.along, [{**best, confirm.along: value} for value in chosen], (*tune.seeds, *confirm.seeds)


def _index(values: list[Any], value: Any) -> int:
    for i, v in enumerate(values):
        if json.dumps(v) == json.dumps(value):
            return i
    raise SweepError(f"value {value!r} is not in {values!r}")


def choose(points: list[Point]) -> Point:
    """The point of lowest mean loss (the first on a tie); diverged points never win
    unless every point diverged."""
    return min(points, key=lambda p: p.mean)


# ------------------------------------------------------------------------ results
def read_loss(folder: RunFolder, metric: str) -> tuple[float | None, str]:
    """(loss, state) of one run: the metric's loss when it is done, inf when training
    stopped on non-finite values (a diverged point: the worst, not an error)."""
    status = folder.status()
    if folder.summary.is_file():
        if metric == "val_loss":
            value = json.loads(folder.summary.read_text()).get("val_loss")
            return (float(value) if value is not None else math.inf), "done"
        report = folder.dir / "evals" / f"{metric}.json"
        if report.is_file():
            value = float(json.loads(report.read_text())["loss"])
            return (value if math.isfinite(value) else math.inf), "done"
        return None, "trained"
    if status.get("state") == "failed" and status.get("failed_stage") == "pretrain" and diverged(folder):
        return math.inf, "diverged"
    if status.get("state") == "failed":
        return None, "failed"
    return None, "partial" if folder.checkpoint.exists() else "pending"


def diverged(folder: RunFolder) -> bool:
    """Training stopped by the non-finite guard (framework/training/nonfinite.py's message)."""
    log = folder.log("pretrain")
    return log.is_file() and "skipped for non-finite values" in log.read_text(errors="replace")


class Tuner:
    """Plans each stage from the run folders in ``root`` and runs what is missing."""

    def __init__(self, tune: TuneSpec, spec: dict, text: str, path: Path, root: Path, data_dir: str | None,
                 sources: list[Path] | None = None) -> None:
        self.tune, self.spec, self.text, self.path, self.root, self.data_dir = tune, spec, text, path, root, data_dir
        self.sources = sources or []  # --done-from: read where root has not adopted them yet (--dry-run)

    def sweep(self, points: list[dict[str, Any]], seeds: tuple[int, ...]) -> Sweep:
        configs = [(point_name(self.tune, p), dict(p), list(seeds)) for p in points]
        return sweep_of(self.spec, self.path, self.text, data_dir=self.data_dir, extra_keys=("tune",), configs=configs)

    def read(self, sweep: Sweep, points: list[dict[str, Any]], seeds: tuple[int, ...]) -> list[Point]:
        read = []
        for values in points:
            point = Point(values=values, seeds=seeds)
            for run in (r for r in sweep.runs if r.config_name == point_name(self.tune, values)):
                loss, state = read_loss(RunFolder(self.root, run), self.tune.metric)
                for source in self.sources if loss is None else []:
                    loss, found = read_loss(RunFolder(source, run), self.tune.metric)
                    if loss is not None:
                        state = f"done in {source} (adopted, not run)" if found == "done" else found
                        break
                point.states[run.seed] = state
                if loss is not None:
                    point.losses[run.seed] = loss
            read.append(point)
        return read

    def stages(self, *, execute: Any = None) -> list[Stage]:
        """Every stage that can be planned; ``execute(sweep)`` (if given) runs a stage's
        missing runs before it is read. Stops at the first stage not complete."""
        best = dict(self.tune.start)  # every searched key, in search order
        stages = []
        keys, began, settled = len(self.tune.search), None, False  # began: where the current pass started
        searching = keys * self.tune.passes
        for index in (*range(searching), *((searching,) if self.tune.confirm else ())):
            if index < searching and index % keys == 0:
                # a pass that left the point where it began: every further one would too
                settled = settled or (index >= 2 * keys and best == began)
                began = dict(best)
            if settled and index < searching:
                continue
            key, points, seeds = stage_points(self.tune, index, best)
            sweep = self.sweep(points, seeds)
            if execute is not None:
                execute(sweep)
            stage = Stage(title=self._title(index, key, best, seeds), key=key, points=self.read(sweep, points, seeds))
            stages.append(stage)
            if not stage.complete:
                return stages
            stage.chosen = choose(stage.points)
            best = dict(stage.chosen.values)
        if stages:
            stages[-1].final = True
        return stages

    def _title(self, index: int, key: str, best: dict[str, Any], seeds: tuple[int, ...]) -> str:
        label = self.tune.labels[key]
        others = ", ".join(f"{self.tune.labels[k]}={v}" for k, v in best.items() if k != key and v is not None)
        keys = len(self.tune.search)
        kind = "confirm" if index >= keys * self.tune.passes else f"stage {index % keys + 1}"
        if self.tune.passes > 1 and kind != "confirm":
            kind = f"pass {index // keys + 1}, {kind}"
        return f"{kind}: {label} ({others}), seeds {list(seeds)}"


# ------------------------------------------------------------------------- output
def stage_table(tune: TuneSpec, stage: Stage) -> list[str]:
    label = tune.labels[stage.key]
    width = max(len(label), *(len(str(p.values[stage.key])) for p in stage.points))
    lines = [f"{label:<{width}}  {'mean loss':>9}  {'std':>7}  seeds"]
    for point in stage.points:
        mean = "diverged" if point.mean == math.inf else "-" if point.mean is None else f"{point.mean:.4f}"
        std = f"{point.std:.4f}" if point.std is not None else "-"
        runs = len(point.losses)
        mark = "  <- chosen" if point is stage.chosen else ""
        lines.append(f"{str(point.values[stage.key]):<{width}}  {mean:>9}  {std:>7}  {runs}/{len(point.seeds)}{mark}")
    chosen = stage.chosen
    if chosen is not None and len(stage.points) > 1 and chosen in (stage.points[0], stage.points[-1]):
        lines.append(f"note: the optimum is at the edge of the values of {stage.key}: extend them to bracket it")
    return lines


def summary(tune: TuneSpec, stages: list[Stage]) -> dict:
    return {"metric": tune.metric, "search": tune.search, "start": tune.start,
            "finished": bool(stages) and stages[-1].final and stages[-1].chosen is not None,
            "chosen": stages[-1].chosen.values if stages and stages[-1].chosen else None,
            "stages": [{"title": s.title, "key": s.key,
                        "chosen": s.chosen.values if s.chosen else None,
                        "points": [{"run": point_name(tune, p.values), "values": p.values, "seeds": list(p.seeds),
                                    "losses": {str(k): v for k, v in p.losses.items()}, "states": p.states,
                                    "mean": p.mean, "std": p.std} for p in s.points]} for s in stages]}


def tuned_recipe(sweep: Sweep, chosen: dict[str, Any], header: list[str], data_dir: str) -> str:
    """The base recipe with the sweep's shared overrides and the chosen values, training
    on the tune file's data folder (no run folder, no machine's path: the recipe of the
    tuned base, for anyone to train from)."""
    recipe = yaml.safe_load(sweep.base.read_text()) or {}
    shared = sweep.runs[0].overrides if sweep.runs else {}
    for key, value in {**shared, **chosen}.items():
        set_dotted(recipe, key, value)
    set_dotted(recipe, "data.data_dir", data_dir)
    return "\n".join(f"# {line}".rstrip() for line in header) + "\n" + yaml.safe_dump(recipe, sort_keys=False)


def write_outputs(tuner: Tuner, stages: list[Stage], command: str) -> Path | None:
    result = summary(tuner.tune, stages)
    result["command"] = command
    write_json(tuner.root / "tune.json", result)
    if not result["finished"]:
        return None
    header = [f"tuned base: {tuner.path.name}, by successive 1-D sweeps on `{tuner.tune.metric}` "
              "(mean loss over seeds; lower is better)", f"  {command}", ""]
    for stage in stages:
        header += [stage.title, *(f"  {line}" for line in stage_table(tuner.tune, stage)), ""]
    header.append("chosen: " + ", ".join(f"{k} = {v}" for k, v in result["chosen"].items()))
    path = tuner.root / "tuned.yaml"
    sweep = tuner.sweep([result["chosen"]], tuner.tune.seeds)
    write_text(path, tuned_recipe(sweep, result["chosen"], header,
                                    str((tuner.spec.get("data") or {}).get("dir") or sweep.data_dir)))
    return path


def print_stages(tune: TuneSpec, stages: list[Stage]) -> None:
    for stage in stages:
        print(stage.title)
        for line in stage_table(tune, stage):
            print("  " + line)
        if not stage.complete:
            pending = [f"{point_name(tune, p.values)},seed={s}: {p.states.get(s, 'pending')}"
                       for p in stage.points for s in p.seeds if s not in p.losses]
            print(f"  next: {len(pending)} runs")
            for line in pending:
                print("    " + line)


# ------------------------------------------------------------------------------ CLI
def _parser() -> argparse.ArgumentParser:
    parser = CommandParser(prog=PROG, description="Tune a base model by successive 1-D sweeps "
                                     "(each through the best point so far), then confirm with more seeds.")
    parser.add_argument("tune", metavar="TUNE.yaml", help="a sweep file with a tune section (see recipes/sweeps/)")
    add_run_options(parser)
    parser.add_argument("--dry-run", action="store_true",
                        help="the stages decided so far and what the next one would run; run nothing")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    check_positive(parser, args, ("jobs", "threads_per_job"))
    words = list(sys.argv[1:] if argv is None else argv)
    command = shlex.join(["layerdrop", "tune", *[w for w in words if w != "--dry-run"]])
    try:
        tune, spec, text = load_tune(args.tune, data_dir=args.data)
        root = Path(args.out)
        sources = [Path(d) for d in args.done_from]
        tuner = Tuner(tune, spec, text, Path(args.tune), root, args.data, sources)
        first = tuner.sweep(stage_points(tune, 0, dict(tune.start))[1], tune.seeds)
        for run in first.runs:  # bad overrides fail here, before anything is written
            predict(run_recipe(first, run, root / "runs" / run.name))
        if args.dry_run:
            print_stages(tune, tuner.stages())
            return 0
        root.mkdir(parents=True, exist_ok=True)
        write_text(root / "tune.yaml", text)
        runner = Runner(first, root, threads=args.threads_per_job)
        prepare_data(first, runner)
        record_invocation(root, words, args, prog=PROG)

        def execute(sweep: Sweep) -> None:
            runner.sweep = sweep
            report_adopted(adopt_finished(sweep, root, sweep.runs, sources) if sources else [], sources)
            # A diverged run would diverge again: it is a result (the worst), not a retry.
            todo = [r for r in sweep.runs if read_loss(RunFolder(root, r), tune.metric)[1] != "diverged"]
            if todo and not runner.stopping:
                run_all(runner, todo, args.jobs)

        stages = tuner.stages(execute=execute)
        print_stages(tune, stages)
        path = write_outputs(tuner, stages, command)
        if runner.stopping:
            print("stopped: run the same command again to resume", file=sys.stderr)
            return 128 + 15
        if path is None:
            print("error: tuning stopped before its last stage: a run did not finish (see above); run the same "
                  "command again to retry it", file=sys.stderr)
            return 1
        print(f"wrote {path} and {root / 'tune.json'}; plots: layerdrop report {root}")
        return 0
    except (SweepError, ValueError) as err:
        print(f"error: {str(err).strip().splitlines()[0]}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

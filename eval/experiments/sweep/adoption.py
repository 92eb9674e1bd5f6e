"""Continuing a sweep from what is committed: runs finished elsewhere are adopted, not re-run.

    layerdrop sweep recipes/sweeps/paper-cpu.yaml --out sweeps/paper-cpu --done-from docs/reproduction

A report folder (`layerdrop report --out`) keeps the small files of every run it shows
under runs/<run>/ (recipe, config, summary, status, evaluations, curve). A run of this
sweep whose folder there is finished (its summary and every evaluation this sweep asks
of it) is copied into the sweep folder instead of trained again, so a grid can be
finished over several sittings and machines: commit the report, continue elsewhere.

A copy is adopted only when it is the same run: its recipe.yaml must equal what this
sweep would write for it, up to the paths that name a machine's folders (the run
folder, the data folder). A different recipe under the same name is an error that
names the run; it is never silently taken (or silently re-run over). Nor is a run trained on
other data than the sweep's folder holds now: where its summary records the data it read
(framework/files/manifest.py's ``data_identity``: the tokenizer's sha256 and each split's
documents and tokens; summaries written before it existed record none and are taken on the
recipe alone), that must match the sweep's prepared folder, so a folder prepared again on
another machine from a corpus that changed is caught before a grid mixes the two.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from eval.experiments.sweep.results import SMALL_FILES
from eval.experiments.sweep.spec import Run, Sweep, SweepError, run_recipe, set_dotted
from framework.files.atomic_write import copy_file, write_json, write_text
from framework.files.manifest import MANIFEST_FILE, data_identity, read_manifest

MACHINE_PATHS = ("trainer.default_root_dir", "data.data_dir")


def finished_elsewhere(sweep: Sweep, runs: list[Run], sources: list[Path]) -> dict[str, Path]:
    """run name -> the source folder (a sweep or report folder) holding it finished."""
    found: dict[str, Path] = {}
    ours = prepared_identity(sweep)  # read once: every candidate run is checked against the same folder
    for source in sources:
        if not (source / "runs").is_dir():
            raise SweepError(f"--done-from {str(source)!r} is invalid: it has no runs/ (expected a sweep folder or "
                             "a report folder made by `layerdrop report --out`)")
        for run in runs:
            if run.name not in found and is_finished(sweep, run, source):
                check_same_recipe(sweep, run, source)
                check_same_data(sweep, run, source, ours)
                found[run.name] = source
    return found


def is_finished(sweep: Sweep, run: Run, root: Path) -> bool:
    """Its summary and every evaluation the sweep asks of it exist (eval/experiments/sweep/runner.py's
    "done", read from the files alone)."""
    folder = root / "runs" / run.name
    return (folder / "summary.json").is_file() and all(
        (folder / "evals" / f"{spec.name}.json").is_file() for spec in sweep.evals if spec.applies_to(run.name))


def check_same_recipe(sweep: Sweep, run: Run, source: Path) -> None:
    recipe = source / "runs" / run.name / "recipe.yaml"
    if not recipe.is_file():
        raise SweepError(f"{recipe.parent} has no recipe.yaml: cannot tell whether it is this sweep's run {run.name!r}")
    theirs = without_machine_paths(yaml.safe_load(recipe.read_text()) or {})
    ours = without_machine_paths(run_recipe(sweep, run, recipe.parent))
    if theirs != ours:
        raise SweepError(f"{recipe} holds a different recipe than this sweep asks for run {run.name!r} "
                         f"({_first_difference(theirs, ours)}): remove it from --done-from or restore the sweep file")


def prepared_identity(sweep: Sweep) -> dict | None:
    """The sweep's prepared folder's ``data_identity``; None while it is not prepared (the check
    runs again after the sweep prepares it)."""
    if not (sweep.data_dir / MANIFEST_FILE).is_file():
        return None
    return data_identity(read_manifest(str(sweep.data_dir)))


def check_same_data(sweep: Sweep, run: Run, source: Path, ours: dict | None) -> None:
    """The run's recorded data identity against ``ours`` (prepared_identity); nothing to check
    when either is missing (a summary older than the record, data not prepared yet)."""
    folder = source / "runs" / run.name
    summary = json.loads((folder / "summary.json").read_text())
    theirs = ((summary.get("data") or {}).get("identity") or {}).get("data")
    if theirs is None or ours is None:
        return
    if theirs != ours:
        raise SweepError(f"{folder} was trained on other data than {str(sweep.data_dir)!r} holds "
                         f"({_first_difference(theirs, ours)}): remove it from --done-from or prepare the "
                         "data as that run's was")


def adopt(sweep: Sweep, root: Path, run: Run, source: Path) -> None:
    """Copy the finished run's small files into ``root`` (its recipe.yaml as this sweep
    writes it: the same up to paths); status.json says where it came from."""
    origin, target = source / "runs" / run.name, root / "runs" / run.name
    (target / "evals").mkdir(parents=True, exist_ok=True)
    for name in SMALL_FILES:
        if (origin / name).is_file():
            copy_file(origin / name, target / name)
    for report in sorted((origin / "evals").glob("*.json")):
        copy_file(report, target / "evals" / report.name)
    write_text(target / "recipe.yaml", yaml.safe_dump(run_recipe(sweep, run, target), sort_keys=False))
    status = json.loads((origin / "status.json").read_text()) if (origin / "status.json").is_file() else {}
    status.update(state="done", adopted_from=str(source))
    write_json(target / "status.json", status)


def adopt_finished(sweep: Sweep, root: Path, runs: list[Run], sources: list[Path]) -> list[str]:
    """Adopt every run not finished in ``root`` that a source holds finished; their names."""
    pending = [r for r in runs if not is_finished(sweep, r, root)]
    found = finished_elsewhere(sweep, pending, sources)
    for run in pending:
        if run.name in found:
            adopt(sweep, root, run, found[run.name])
    return sorted(found)


def without_machine_paths(recipe: dict) -> dict:
    """The recipe with the paths that name this machine's folders (the run's, the data's)
    blanked: two recipes equal up to these are the same run in another place."""
    recipe = json.loads(json.dumps(recipe))
    for key in MACHINE_PATHS:
        set_dotted(recipe, key, None)
    return recipe


def _first_difference(a: dict, b: dict, prefix: str = "") -> str:
    for key in sorted(set(a) | set(b), key=str):
        left, right = a.get(key), b.get(key)
        if isinstance(left, dict) and isinstance(right, dict):
            if left != right:
                return _first_difference(left, right, f"{prefix}{key}.")
        elif left != right:
            return f"{prefix}{key}: {left!r} there, {right!r} here"
    return "?"


__all__ = ["adopt_finished", "finished_elsewhere", "is_finished", "check_same_recipe", "check_same_data",
           "prepared_identity", "adopt", "without_machine_paths"]

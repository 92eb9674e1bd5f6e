"""The folder `layerdrop report` writes into, and when it may write into one that exists.

A report folder is one whose report.json was written by `layerdrop report` (it records
the command that wrote it as ``report_command``). ``--out`` may be:

- a new or empty folder: written;
- a report: replaced with ``--overwrite``, refused without it. What a report writes
  (``WRITTEN``) is removed first, so no plot of the earlier report survives; anything
  else a person put in the folder stays;
- any other folder that is not empty (another sweep's folder, prepared data, a home
  directory): refused, with or without ``--overwrite``: a report never replaces what
  it did not write.

A report rebuilt in place (``--out`` is SWEEP_DIR, a report folder read through its own
runs/ copy) keeps that copy: it is the input.

A projection (``layerdrop report --project``: projection.md and projection.json, registered
before the runs of the budget it projects) is written into the folder that budget's report will
take: a report may be written beside it and never removes it; ``--project`` replaces an earlier
projection only with ``--overwrite``, and writes beside a report, never into another folder.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

REPORT_FILE = "report.json"
WRITTEN = ("README.md", REPORT_FILE, "images", "runs", "sweep.yaml", "machine.json")
INPUTS = ("runs", "sweep.yaml", "machine.json")  # what a report rebuilt in place reads
PROJECTION_FILE = "projection.json"
PROJECTION = ("projection.md", PROJECTION_FILE)  # `--project`'s, kept by every report


class ReportFolderError(ValueError):
    """An --out that a report may not be written into (one line, shown as it is)."""


def _written_by_report(path: Path, key: str) -> bool:
    """Whether ``path`` is a JSON record whose ``key`` is the `layerdrop report` command that wrote it."""
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(record, dict) and str(record.get(key, "")).startswith("layerdrop report")


def is_report(folder: Path) -> bool:
    return _written_by_report(folder / REPORT_FILE, "report_command")


def is_projection(folder: Path) -> bool:
    return _written_by_report(folder / PROJECTION_FILE, "projection_command")


def check_out(out: Path, overwrite: bool, *, projection: bool = False) -> None:
    """Refuse, before any work, an --out this report (``projection``: this projection) may not write into."""
    if out.exists() and not out.is_dir():
        raise ReportFolderError(f"--out {str(out)!r} is a file: give a folder")
    if not out.is_dir():
        return
    entries = {p.name for p in out.iterdir()}
    if projection:
        others = entries - set(PROJECTION) - (set(WRITTEN) if is_report(out) else set())
        if others or (entries & set(PROJECTION) and not is_projection(out)):
            raise ReportFolderError(f"--out {str(out)!r} holds what no report or projection wrote: give a new or "
                                    "empty folder, or the report folder the projected budget will use")
        if is_projection(out) and not overwrite:
            raise ReportFolderError(f"--out {str(out)!r} already holds a projection: pass --overwrite to replace it")
        return
    if not entries - set(PROJECTION) and (not entries or is_projection(out)):
        return  # empty, or a registered projection awaiting its report
    if not is_report(out):
        raise ReportFolderError(f"--out {str(out)!r} is not empty and holds no report (no {REPORT_FILE} written by "
                                "`layerdrop report`): give a new or empty folder (--overwrite replaces only a report)")
    if not overwrite:
        raise ReportFolderError(f"--out {str(out)!r} already holds a report: pass --overwrite to replace it")


def clear_report(out: Path, sweep_dir: Path) -> None:
    """Remove what an earlier report wrote into ``out`` (its inputs stay when it is rebuilt in place)."""
    keep = INPUTS if out.resolve() == sweep_dir.resolve() else ()
    for name in WRITTEN:
        path = out / name
        if name in keep or not (path.exists() or path.is_symlink()):
            continue
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()


__all__ = ["ReportFolderError", "is_report", "is_projection", "check_out", "clear_report", "WRITTEN", "PROJECTION",
           "PROJECTION_FILE"]

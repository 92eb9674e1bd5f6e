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
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

REPORT_FILE = "report.json"
WRITTEN = ("README.md", REPORT_FILE, "images", "runs", "sweep.yaml", "machine.json")
INPUTS = ("runs", "sweep.yaml", "machine.json")  # what a report rebuilt in place reads


class ReportFolderError(ValueError):
    """An --out that a report may not be written into (one line, shown as it is)."""


def is_report(folder: Path) -> bool:
    try:
        record = json.loads((folder / REPORT_FILE).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(record, dict) and str(record.get("report_command", "")).startswith("layerdrop report")


def check_out(out: Path, overwrite: bool) -> None:
    """Refuse, before any work, an --out this report may not write into."""
    if out.exists() and not out.is_dir():
        raise ReportFolderError(f"--out {str(out)!r} is a file: give a folder")
    if not out.is_dir() or not any(out.iterdir()):
        return
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


__all__ = ["ReportFolderError", "is_report", "check_out", "clear_report", "WRITTEN"]

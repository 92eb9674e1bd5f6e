"""What a run that failed before its first step leaves behind: nothing.

    remove_at_exit_if_unused(root, checkpoints)   # at parse time, for folders that do not exist yet

A run creates its folders before it trains: the run-folder lock, ``checkpoints/`` with the
data's tokenizer copied at fit start, ``lightning_logs/``. When it stops before a step (a
bad value found late, a missing file, Ctrl-C while loading), an empty run folder would
pass for a run (``--resume auto`` finds it, `sweep` counts it). At interpreter exit, after
the run's locks are released, a folder this run created is removed when it still holds
nothing a run makes: no checkpoint, no log, no summary, no export.
"""

from __future__ import annotations

import atexit
import shutil
from pathlib import Path

from framework.files.staging import is_url

# Names that do not make a folder a run: the lock files, the tokenizer copy, staging leftovers.
_NOT_A_RUN = ("tokenizer.json",)
_LOCK_PREFIX = ".layerdrop.lock"


def holds_nothing_of_a_run(folder: Path) -> bool:
    """Whether ``folder`` holds only lock files, the tokenizer copy, hidden staging
    leftovers and empty folders (recursively)."""
    for entry in folder.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            if not holds_nothing_of_a_run(entry):
                return False
        elif not (entry.name in _NOT_A_RUN or entry.name.startswith(_LOCK_PREFIX)
                  or entry.name.endswith((".staging", ".deleting")) or ".partial-" in entry.name):
            return False
    return True


def remove_if_unused(*folders: Path) -> None:
    for folder in folders:
        try:
            if folder.is_dir() and not folder.is_symlink() and holds_nothing_of_a_run(folder):
                shutil.rmtree(folder, ignore_errors=True)
        except OSError:  # gone already, or not ours to read: leave it
            pass


def remove_at_exit_if_unused(*folders: Path | str) -> None:
    """Of ``folders``, those that do not exist now are removed at exit if still unused."""
    fresh = [Path(folder) for folder in folders if not is_url(folder) and not Path(folder).exists()]
    if fresh:
        atexit.register(remove_if_unused, *fresh)


__all__ = ["holds_nothing_of_a_run", "remove_if_unused", "remove_at_exit_if_unused"]

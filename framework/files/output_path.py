"""The check of an output path, before any work: would writing it fail, or replace what
the user did not ask to replace?

Every command that writes asks here first (eval/options.py's ``refuse_existing`` for
reports and plots, `layerdrop recipe`, `layerdrop export`), so a bad ``--out`` is one
line in a second, not a traceback after minutes of work. Each function returns the
problem as a sentence (None when there is none); the command raises its own error.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def exists_message(path: str | Path) -> str:
    """The one wording of 'this output is already there' (commands and library alike)."""
    return f"{str(path)!r} already exists; pass --overwrite to replace it"


def file_problem(path: str | Path, overwrite: bool) -> str | None:
    """Why the file ``path`` cannot be written: a folder in its place, a file there
    without --overwrite, or no writable folder to hold it."""
    path = Path(path)
    if path.is_dir():
        return f"{str(path)!r} is a folder; name the file to write (--overwrite replaces a file, never a folder)"
    if path.exists() and not overwrite:
        return exists_message(path)
    return _unwritable(path, path.parent)


def folder_problem(path: str | Path) -> str | None:
    """Why the folder ``path`` cannot be written: a file in its place, or no writable
    folder above it. (What may be replaced inside it is the command's rule.)"""
    path = Path(path)
    if path.exists() and not path.is_dir():
        return f"{str(path)!r} is a file, not a folder"
    return _unwritable(path, path)


def _unwritable(path: Path, folder: Path) -> str | None:
    """The nearest existing folder at or above ``folder`` must take a new file: tried
    with a probe file removed at once (permission bits do not tell root, or a
    read-only mount, the truth)."""
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return f"{str(path)!r} cannot be written: {str(existing)!r} is a file, not a folder"
    try:
        handle, probe = tempfile.mkstemp(dir=existing, prefix=".layerdrop-probe-")
    except OSError as err:
        return f"{str(path)!r} cannot be written: {str(existing)!r} is not writable ({err.strerror})"
    os.close(handle)
    os.unlink(probe)
    return None


__all__ = ["exists_message", "file_problem", "folder_problem"]

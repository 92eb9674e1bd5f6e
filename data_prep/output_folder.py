"""The output folder: refuse to clobber data, build beside it, swap in at the very end.

--overwrite replaces prepared data (a folder with its manifest.json) and nothing else:
never a folder of other files, the working directory, or a folder holding an input.

Everything is written into a hidden staging sibling (``.NAME.staging-PID``, the
protocol of framework/files/staging.py); only a run that finished moves it into place. A failed or interrupted run removes its own
staging folder and leaves whatever was at ``--out`` untouched. With ``--overwrite``
the old folder is moved aside first and deleted only after the new one is in place.
A killed run cannot clean up: the next run for the same ``--out`` removes the staging
folders of runs that are no longer alive, and puts back a folder moved aside whose
replacement never arrived (``clean_leftovers_beside``).
"""

from __future__ import annotations

import os
import shutil
from typing import Iterable, Mapping

from data_prep.errors import PrepareError
from framework.files.manifest import MANIFEST_FILE
from framework.files.staging import clean_leftovers, hidden, is_url, publish


def check_output_folder(path: str, overwrite: bool, inputs: Mapping[str, Iterable[str]] = {}) -> None:
    """Refuse (before any work) what --out must not replace: a file, the working directory
    or a folder above it, a folder holding an input (``inputs``: flag -> the paths it
    read), a folder holding data without --overwrite, and with --overwrite anything but
    prepared data (a folder with its manifest.json)."""
    if is_url(path):
        raise PrepareError(f"--out {path!r}: give a local folder (copy it to object storage afterwards)")
    if os.path.exists(path) and not os.path.isdir(path):
        raise PrepareError(f"--out {path!r} is a file, not a folder")
    if _inside(os.getcwd(), path):
        raise PrepareError(f"--out {path!r} is the working directory or holds it; name a folder of its own")
    if not os.path.isdir(path) or not (entries := os.listdir(path)):
        return
    for flag, paths in inputs.items():
        if (inside := next((p for p in paths if _inside(p, path)), None)) is not None:
            raise PrepareError(f"--out {path!r} holds the input {flag} {inside!r}, which replacing it would "
                               "delete; write the output elsewhere")
    if not overwrite:
        raise PrepareError(f"--out {path!r} already holds data ({len(entries)} entries); "
                           "pass --overwrite to replace it")
    if not os.path.isfile(os.path.join(path, MANIFEST_FILE)):
        raise PrepareError(f"--out {path!r} holds {len(entries)} entries but no {MANIFEST_FILE}: it is not "
                           "data made by layerdrop prepare, the only thing --overwrite replaces; choose another --out")


def _inside(path: str, folder: str) -> bool:
    """``path`` is ``folder`` or below it (links resolved)."""
    path, folder = os.path.realpath(path), os.path.realpath(folder)
    return os.path.commonpath([path, folder]) == folder


def clean_leftovers_beside(path: str) -> list[str]:
    """Remove what killed runs for ``path`` left beside it; returns the names removed.
    Called before ``check_output_folder``: a folder put back is data to protect."""
    parent, name = os.path.split(os.path.abspath(path))
    return clean_leftovers(parent, name)


class StagingFolder:
    """Context manager: yields the staging path; ``commit()`` swaps it into ``path``."""

    def __init__(self, path: str) -> None:
        self.path = os.path.abspath(path)
        self.staging = str(hidden(self.path, "staging", os.getpid()))
        self.committed = False

    def __enter__(self) -> str:
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        shutil.rmtree(self.staging, ignore_errors=True)  # a leftover of a killed run with our pid
        os.makedirs(self.staging)
        return self.staging

    def commit(self) -> None:
        # Not flushed file by file: data can be prepared again, a checkpoint's hours cannot.
        publish(self.staging, self.path, owner=os.getpid(), durable=False)
        self.committed = True

    def __exit__(self, *exc_info) -> None:
        if not self.committed:
            shutil.rmtree(self.staging, ignore_errors=True)

"""The folder a run keeps its checkpoints in, and the rules that make it crash-safe.

    step-00000080.ckpt      a complete checkpoint (a file, or a folder of shards)
    last.ckpt -> step-00000080.ckpt     a symbolic link to the newest one
    .step-00000120.ckpt.staging         a save in progress (or killed half-way)

A checkpoint goes through framework/files/staging.py's protocol: written under a hidden
staging name and renamed to its final name only once every rank has finished writing it
(``publish``), so a name without a leading dot is always complete; a name that already
exists is moved aside first and deleted after the new one is in place. Here: ``last.ckpt``
is repointed with an atomic rename of a new link over the old one; an old checkpoint is
renamed away before it is deleted (``retire``). Whatever a crash leaves behind is a
hidden name that ``clean_leftovers`` removes (or, for a checkpoint moved aside whose
replacement never arrived, puts back).

Every function here that changes the folder is called on global rank 0 only.
"""


from __future__ import annotations

import os
import re
from pathlib import Path

from framework.files.atomic_write import fsync_dir
from framework.files.staging import clean_leftovers, hidden, publish, remove_path

LAST = "last.ckpt"
STEP_NAME = re.compile(r"^step-(\d+)\.ckpt$")


def staging_path(target: str | os.PathLike) -> Path:
    """Where the checkpoint ``target`` is written before it is published."""
    return hidden(target, "staging")


def point_last(target: str | os.PathLike, link: str | os.PathLike) -> None:
    """Make ``link`` (last.ckpt) a relative symbolic link to ``target`` in one atomic
    rename: a reader sees the old link or the new one, never none."""
    target, link = Path(target), Path(link)
    temporary = hidden(link, "link")
    remove_path(temporary)
    os.symlink(os.path.relpath(target, link.parent), temporary)
    if link.is_dir() and not link.is_symlink():  # a real folder from an earlier layout
        publish(temporary, link)
        return
    os.replace(temporary, link)
    fsync_dir(link.parent)


def retire(path: str | os.PathLike) -> None:
    """Delete a checkpoint by renaming it to a hidden name first, so that a crash
    half-way through the deletion leaves a leftover, never a damaged checkpoint."""
    path = Path(path)
    if not os.path.lexists(path):
        return
    doomed = hidden(path, "deleting")
    remove_path(doomed)
    os.rename(path, doomed)
    remove_path(doomed)


def finish_replacement(target: str | os.PathLike) -> str | None:
    """Finish a ``publish`` of ``target`` that was interrupted between its two renames
    (the old one moved aside, the new one complete under its staging name, nothing
    under the name): the new one goes in. A staging folder alone is a write that never
    finished and is removed. Returns what was done, None when nothing was."""
    target = Path(target)
    replaced, staging = hidden(target, "replaced"), hidden(target, "staging")
    done = None
    if os.path.lexists(replaced) and not os.path.lexists(target):
        if os.path.lexists(staging):
            os.rename(staging, target)
            done = f"finished the interrupted replacement of {target}"
        else:
            os.rename(replaced, target)
            return f"put back {target}, whose replacement never arrived"
    for leftover in (replaced, staging):
        remove_path(leftover)
    return done


def step_checkpoints(folder: str | os.PathLike) -> list[tuple[int, Path]]:
    """The ``step-N.ckpt`` entries of ``folder`` as (N, path), newest first."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    found = [(int(m[1]), entry) for entry in folder.iterdir() if (m := STEP_NAME.match(entry.name))]
    return sorted(found, key=lambda item: item[0], reverse=True)


__all__ = ["LAST", "staging_path", "publish", "point_last", "retire", "finish_replacement", "clean_leftovers",
           "step_checkpoints", "remove_path"]

"""The folder a run keeps its checkpoints in, and the rules that make it crash-safe.

    step-00000080.ckpt      a complete checkpoint (a file, or a folder of shards)
    last.ckpt -> step-00000080.ckpt     a symbolic link to the newest one
    .step-00000120.ckpt.staging         a save in progress (or killed half-way)

A checkpoint is written under a hidden staging name and renamed to its final name
only once every rank has finished writing it (``publish``), so a name without a
leading dot is always complete. A checkpoint is never modified in place: a name that
already exists is moved aside first and deleted after the new one is in place;
``last.ckpt`` is repointed with an atomic rename of a new link over the old one; an
old checkpoint is renamed away before it is deleted (``retire``). Whatever a crash
leaves behind is a hidden name that ``clean_leftovers`` removes (or, for a checkpoint
moved aside whose replacement never arrived, puts back).

Every function here that changes the folder is called on global rank 0 only.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from framework.files.atomic_write import fsync_dir

LAST = "last.ckpt"
STEP_NAME = re.compile(r"^step-(\d+)\.ckpt$")
# Hidden names a save, a replacement, a removal or a link swap goes through; a
# ``.partial-PID-TID`` file is framework/files/atomic_write.py's (AtomicCheckpointIO's).
_LEFTOVER = re.compile(r"^\.(?P<name>.+)\.(?P<kind>staging|replaced|deleting|link)$|^\..+\.partial-\d+(-\d+)?$")


def staging_path(target: str | os.PathLike) -> Path:
    """Where the checkpoint ``target`` is written before it is published."""
    return _hidden(target, "staging")


def _hidden(target: str | os.PathLike, kind: str) -> Path:
    target = Path(target)
    return target.with_name(f".{target.name}.{kind}")


def remove_path(path: str | os.PathLike) -> None:
    """Remove a file, a link or a folder, whichever ``path`` is (nothing when absent)."""
    path = Path(path)
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif os.path.lexists(path):
        path.unlink()


def publish(staging: str | os.PathLike, target: str | os.PathLike) -> None:
    """Move the complete checkpoint ``staging`` to its final name ``target``.

    The data is flushed to disk first (a checkpoint that survives a crash of the
    process should survive a crash of the machine too); an existing ``target`` is
    moved aside, not written into, and deleted once the new one is in place.
    """
    staging, target = Path(staging), Path(target)
    _fsync_tree(staging)
    replaced = None
    if os.path.lexists(target):
        replaced = _hidden(target, "replaced")
        remove_path(replaced)
        os.rename(target, replaced)
    os.rename(staging, target)
    fsync_dir(target.parent)
    if replaced is not None:
        remove_path(replaced)


def point_last(target: str | os.PathLike, link: str | os.PathLike) -> None:
    """Make ``link`` (last.ckpt) a relative symbolic link to ``target`` in one atomic
    rename: a reader sees the old link or the new one, never none."""
    target, link = Path(target), Path(link)
    temporary = _hidden(link, "link")
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
    doomed = _hidden(path, "deleting")
    remove_path(doomed)
    os.rename(path, doomed)
    remove_path(doomed)


def finish_replacement(target: str | os.PathLike) -> str | None:
    """Finish a ``publish`` of ``target`` that was interrupted between its two renames
    (the old one moved aside, the new one complete under its staging name, nothing
    under the name): the new one goes in. A staging folder alone is a write that never
    finished and is removed. Returns what was done, None when nothing was."""
    target = Path(target)
    replaced, staging = _hidden(target, "replaced"), _hidden(target, "staging")
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


def clean_leftovers(folder: str | os.PathLike) -> list[str]:
    """Remove what interrupted saves, replacements and removals left in ``folder``.

    A checkpoint that was moved aside for a replacement that never arrived goes back
    to its name. Returns the names removed.
    """
    folder = Path(folder)
    if not folder.is_dir():
        return []
    removed = []
    for entry in sorted(folder.iterdir()):
        match = _LEFTOVER.match(entry.name)
        if match is None:
            continue
        if match["kind"] == "replaced" and not os.path.lexists(folder / match["name"]):
            os.rename(entry, folder / match["name"])
            continue
        remove_path(entry)
        removed.append(entry.name)
    if removed:
        fsync_dir(folder)
    return removed


def step_checkpoints(folder: str | os.PathLike) -> list[tuple[int, Path]]:
    """The ``step-N.ckpt`` entries of ``folder`` as (N, path), newest first."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    found = [(int(m[1]), entry) for entry in folder.iterdir() if (m := STEP_NAME.match(entry.name))]
    return sorted(found, key=lambda item: item[0], reverse=True)


def _fsync_tree(path: Path) -> None:
    """fsync every file under ``path`` (the shards other ranks wrote included), then the folders."""
    if path.is_symlink() or not path.exists():
        return
    if path.is_file():
        with open(path, "rb") as handle:
            os.fsync(handle.fileno())
        return
    for root, _, files in os.walk(path):
        for name in files:
            with open(os.path.join(root, name), "rb") as handle:
                os.fsync(handle.fileno())
        fsync_dir(root)


__all__ = ["LAST", "staging_path", "publish", "point_last", "retire", "finish_replacement", "clean_leftovers",
           "step_checkpoints", "remove_path"]

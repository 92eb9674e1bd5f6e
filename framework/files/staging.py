"""The one staging protocol: whatever must appear whole (a checkpoint, prepared data, an
export) is written under a hidden name beside its target and renamed into place, so a
name without a leading dot is always complete. A target that already exists is moved
aside first and deleted only once the new one is in place. Whatever a crash leaves is a
hidden name that ``clean_leftovers`` removes, or puts back:

    .NAME.staging[-PID]     being written
    .NAME.replaced[-PID]    the old NAME, moved aside for its replacement
    .NAME.deleting          being deleted (the checkpoint folder's ``retire``)
    .NAME.link              a new symbolic link before it replaces NAME
    .NAME.partial-PID-TID   framework/files/atomic_write.py's partial file

A name with ``-PID`` belongs to the process that made it, for writers that hold no lock
(``layerdrop prepare``): it is left alone while that process lives. A name without one
belongs to whoever holds the folder's run lock (framework/files/run_lock.py).

Only local paths take part: ``is_url`` tells a URL (``s3://``, ``gs://``, litdata's
``local:``), which the library writing it handles its own way.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from framework.files.atomic_write import fsync_dir

KINDS = ("staging", "replaced", "deleting", "link")
_LEFTOVER = re.compile(rf"^\.(?P<name>.+)\.(?P<kind>{'|'.join(KINDS)})(-(?P<owner>\d+))?$"
                       r"|^\.(?P<file>.+)\.partial-\d+(-\d+)?$")


def is_url(path: str | os.PathLike) -> bool:
    """A location a library streams from or to (``s3://``, ``gs://``, ``local:``), not a path here."""
    path = str(path)
    return "://" in path or path.startswith("local:")


def hidden(target: str | os.PathLike, kind: str, owner: int | None = None) -> Path:
    """The hidden name of ``kind`` beside ``target`` (``owner``: the pid that owns it)."""
    target = Path(target)
    return target.with_name(f".{target.name}.{kind}" + ("" if owner is None else f"-{owner}"))


def remove_path(path: str | os.PathLike) -> None:
    """Remove a file, a link or a folder, whichever ``path`` is (nothing when absent)."""
    path = Path(path)
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif os.path.lexists(path):
        path.unlink()


def publish(staging: str | os.PathLike, target: str | os.PathLike, *, owner: int | None = None,
            durable: bool = True) -> None:
    """Move the complete ``staging`` to its final name ``target``; an existing ``target``
    is moved aside (``.NAME.replaced``), not written into, and deleted once the new one is
    in place. ``durable``: flush every file first, so that what survives a crash of the
    process survives a crash of the machine too."""
    staging, target = Path(staging), Path(target)
    if durable:
        fsync_tree(staging)
    replaced = None
    if os.path.lexists(target):
        replaced = hidden(target, "replaced", owner)
        remove_path(replaced)
        os.rename(target, replaced)
    os.rename(staging, target)
    if durable:
        fsync_dir(target.parent)
    if replaced is not None:
        remove_path(replaced)


def clean_leftovers(folder: str | os.PathLike, name: str | None = None) -> list[str]:
    """Remove what interrupted writes left in ``folder`` (only those of the target
    ``name`` when given; never those of a live owner). A target moved aside for a
    replacement that never arrived goes back to its name. Returns the names removed."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    removed = []
    for entry in sorted(folder.iterdir()):
        match = _LEFTOVER.match(entry.name)
        if match is None or (name is not None and name not in (match["name"], match["file"])):
            continue
        if match["owner"] is not None and _alive(int(match["owner"])):
            continue
        if match["kind"] == "replaced" and not os.path.lexists(folder / match["name"]):
            os.rename(entry, folder / match["name"])  # killed between moving the old aside and the new in
            continue
        remove_path(entry)
        removed.append(entry.name)
    if removed:
        fsync_dir(folder)
    return removed


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return False  # our own: a leftover of an earlier process that had our pid
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def fsync_tree(path: str | os.PathLike) -> None:
    """fsync every file under ``path`` (the shards other ranks wrote included), then the folders."""
    path = Path(path)
    if path.is_symlink() or not path.exists():
        return
    if path.is_file():
        with open(path, "rb") as handle:
            os.fsync(handle.fileno())
        return
    for root, _, files in os.walk(path):
        for file in files:
            with open(os.path.join(root, file), "rb") as handle:
                os.fsync(handle.fileno())
        fsync_dir(root)


__all__ = ["KINDS", "is_url", "hidden", "remove_path", "publish", "clean_leftovers", "fsync_tree"]

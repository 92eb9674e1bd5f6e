"""A full disk, said in one line: which file, how many bytes it needed, how many were free.

    check_room(path, needed)        DiskFull before a write whose size is known not to fit
    on_disk(length, path)           the room files of that length take there (whole blocks)
    if is_disk_full(err): ...       ENOSPC anywhere in an exception's chain (torch's zip
                                    writer and DCP wrap the OSError in their own errors)
    size_on_disk(path)              a file's size, or a folder's (a sharded checkpoint)
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

# What a write can end in when the room runs out: the disk (ENOSPC), a quota (EDQUOT),
# a file-size limit (EFBIG, e.g. ulimit -f).
NO_ROOM = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}


class DiskFull(OSError):
    """A write that did not fit; ``str()`` is the one line to print."""

    def __init__(self, message: str) -> None:
        super().__init__(errno.ENOSPC, message)
        self.message = message

    def __str__(self) -> str:
        return self.message


def free_bytes(path: str | os.PathLike) -> int:
    """Free bytes on the filesystem that holds ``path`` (its nearest existing folder)."""
    return shutil.disk_usage(_nearest_folder(path)).free


def on_disk(length: int, path: str | os.PathLike, files: int = 1) -> int:
    """The most room ``files`` files (or folders) of ``length`` bytes in all can take on
    the filesystem that holds ``path``: each fills its last block."""
    block = os.statvfs(_nearest_folder(path)).f_frsize or 1
    return -(-length // block) * block + (files - 1) * block


def _nearest_folder(path: str | os.PathLike) -> Path:
    folder = Path(path)
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return folder


def check_room(path: str | os.PathLike, needed: int, what: str = "the file") -> None:
    free = free_bytes(path)
    if needed > free:
        raise DiskFull(f"not enough disk space for {path}: {what} needs {needed:,} bytes, {free:,} are free")


def is_disk_full(error: BaseException | None) -> bool:
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, DiskFull) or (isinstance(error, OSError) and error.errno in NO_ROOM):
            return True
        if "No space left on device" in str(error) or "Disk quota exceeded" in str(error):
            return True  # torch's zip writer keeps only the text of the OSError
        error = error.__cause__ or error.__context__
    return False


def size_on_disk(path: str | os.PathLike) -> int:
    path = Path(path)
    if path.is_file():
        return path.stat().st_size
    return sum(entry.stat().st_size for entry in path.rglob("*") if entry.is_file()) if path.is_dir() else 0


__all__ = ["DiskFull", "check_room", "free_bytes", "on_disk", "is_disk_full", "size_on_disk", "NO_ROOM"]

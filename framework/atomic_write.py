"""Writing a file so that a reader (or a crash) never sees half of it.

The bytes go to a hidden partial file beside the target (``.NAME.partial-PID``: the
same folder, so the final rename never crosses a filesystem and never copies), are
flushed to disk, and only then renamed over the target in one ``os.replace``. A
failure removes the partial file and leaves whatever was at the target untouched.
Folders of files are staged and renamed whole by their owners
(framework/checkpoint/folder.py, data_prep/output_folder.py).
"""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path
from typing import IO, Any


def partial_path(target: str | os.PathLike) -> Path:
    """The hidden name ``target`` is written under; unique per process and thread, so
    two writers of one target never share a partial file."""
    target = Path(target)
    return target.with_name(f".{target.name}.partial-{os.getpid()}-{threading.get_ident()}")


class AtomicFile:
    """An open partial file that becomes ``target`` on ``commit()`` and vanishes on
    ``abort()``. As a context manager (``with AtomicFile(path) as handle``) it
    commits when the block ends without an error and aborts otherwise."""

    def __init__(self, target: str | os.PathLike, mode: str = "w", **open_kwargs: Any) -> None:
        self.target = Path(target)
        self.partial = partial_path(self.target)
        self.handle: IO = open(self.partial, mode, **open_kwargs)

    def commit(self) -> None:
        try:
            self.handle.flush()
            os.fsync(self.handle.fileno())
            self.handle.close()
            os.replace(self.partial, self.target)
        finally:
            self.abort()
        fsync_dir(self.target.parent)

    def abort(self) -> None:
        self.handle.close()
        self.partial.unlink(missing_ok=True)

    def __enter__(self) -> IO:
        return self.handle

    def __exit__(self, kind: Any, error: Any, traceback: Any) -> None:
        if kind is None:
            self.commit()
        else:
            self.abort()


def write_text(target: str | os.PathLike, text: str) -> None:
    with AtomicFile(target) as handle:
        handle.write(text)


def copy_file(source: str | os.PathLike, target: str | os.PathLike) -> None:
    with open(source, "rb") as reading, AtomicFile(target, "wb") as handle:
        shutil.copyfileobj(reading, handle)


def fsync_dir(folder: str | os.PathLike) -> None:
    """Make renames in ``folder`` durable (POSIX; a no-op where folders cannot be opened)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


__all__ = ["AtomicFile", "write_text", "copy_file", "partial_path", "fsync_dir"]

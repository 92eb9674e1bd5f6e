"""Writing a file so that a reader sees the old content or the new, never a part.

Every write goes to a hidden partial file beside the target (same folder, so the same
filesystem), is flushed and fsynced, and is then renamed over the target with
``os.replace`` (atomic on POSIX). A failed write removes its partial file and leaves
the target as it was. The partial file's name carries the process and thread, so two
writers of the same target never write into each other's partial file; the last
rename wins.

    write_text(path, text)      write_json(path, data)      copy_file(source, target)
    with replacing(path) as partial: ...write partial...    (any writer: torch.save, a stream)
"""

from __future__ import annotations

import json
import os
import shutil
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator


@contextmanager
def replacing(path: str | os.PathLike) -> Iterator[Path]:
    """A partial path to write; on a clean exit it is fsynced and renamed over ``path``
    (its folder created first), on an error removed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial-{os.getpid()}-{threading.get_ident()}")
    try:
        yield partial
        fsync_file(partial)
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)


def write_text(path: str | os.PathLike, text: str) -> Path:
    with replacing(path) as partial:
        partial.write_text(text)
    return Path(path)


def write_json(path: str | os.PathLike, data: Any) -> Path:
    """``data`` as indented JSON with a final newline (the form of every report and record)."""
    return write_text(path, json.dumps(data, indent=2) + "\n")


def copy_file(source: str | os.PathLike, target: str | os.PathLike) -> Path:
    with replacing(target) as partial:
        shutil.copyfile(source, partial)
    return Path(target)


def fsync_file(path: str | os.PathLike) -> None:
    with open(path, "rb") as handle:
        os.fsync(handle.fileno())


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


__all__ = ["replacing", "write_text", "write_json", "copy_file", "fsync_file", "fsync_dir"]

"""What `layerdrop pretrain`'s parser says, kept on disk per version of the code.

    text = cached("help-100.txt", build)    # build() once per fingerprint, then read back

The parser is LightningCLI's: building it imports Lightning and the model stack (~4 s on
an idle core, ~20 s on a loaded one) just to print `--help` or to name a mistyped key.
What it answers depends only on the code, so it is built once and kept under
``$XDG_CACHE_HOME/layerdrop/pretrain-<fingerprint>/`` (default ``~/.cache``). The
fingerprint hashes every framework source file and the versions of the libraries whose
signatures the parser reads: an edit or an upgrade makes a new entry, never a stale one.
A cache folder that cannot be written only costs the build each time.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from functools import cache
from importlib import metadata
from pathlib import Path

from framework.files.atomic_write import write_text

FRAMEWORK = Path(__file__).resolve().parents[1]
LIBRARIES = ("lightning", "jsonargparse", "torch")


@cache
def fingerprint() -> str:
    digest = hashlib.sha256()
    for library in LIBRARIES:
        try:
            digest.update(f"{library}={metadata.version(library)}\n".encode())
        except metadata.PackageNotFoundError:
            digest.update(f"{library}=none\n".encode())
    for path in sorted(FRAMEWORK.rglob("*.py")):
        digest.update(str(path.relative_to(FRAMEWORK)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def cache_dir() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(root) / "layerdrop" / f"pretrain-{fingerprint()}"


def cached(name: str, build: Callable[[], str]) -> str:
    """The text kept under ``name`` for this code, built (and kept) when missing."""
    path = cache_dir() / name
    try:
        return path.read_text(encoding="utf-8")
    except OSError:
        pass
    text = build()
    try:
        write_text(path, text)  # whole or absent: a concurrent reader never sees half
    except OSError:
        pass
    return text


def is_cached(name: str) -> bool:
    return (cache_dir() / name).is_file()


__all__ = ["cached", "cache_dir", "fingerprint", "is_cached"]

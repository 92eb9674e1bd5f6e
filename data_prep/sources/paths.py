"""A path, a folder or a glob -> the files it names, sorted (the reading order)."""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass, field

from data_prep.errors import PrepareError

_GLOB_CHARACTERS = set("*?[")


def _has_glob(pattern: str) -> bool:
    return any(char in _GLOB_CHARACTERS for char in pattern)


def walk_files(directory: str) -> list[str]:
    """Every file below ``directory``, sorted; hidden files and folders (.git, .venv,
    .cache) are never corpus material."""
    found = []
    for root, dirs, files in os.walk(directory):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        found += [os.path.join(root, f) for f in sorted(files) if not f.startswith(".")]
    return found


def resolve_paths(pattern: str, flag: str) -> list[str]:
    """Files named by ``pattern``: a file, a folder (all files below it) or a glob."""
    if _has_glob(pattern):
        matches = sorted(p for p in glob.glob(pattern, recursive=True) if os.path.isfile(p))
        if not matches:
            raise PrepareError(f"{flag} {pattern!r}: the glob matches no files")
        return matches
    if os.path.isdir(pattern):
        files = walk_files(pattern)
        if not files:
            raise PrepareError(f"{flag} {pattern!r}: the folder holds no files")
        return files
    if os.path.isfile(pattern):
        return [pattern]
    raise PrepareError(f"{flag} {pattern!r}: no such file or folder")


def keep_positions(paths: list[str], positions: list[int]) -> list[str]:
    return [paths[i] for i in positions]


@dataclass
class PatternFiles:
    """The base of a source that reads the files one ``pattern`` names (its ``flag``'s value)."""

    pattern: str
    paths: list[str] = field(init=False)
    flag = ""

    def __post_init__(self) -> None:
        self.paths = resolve_paths(self.pattern, self.flag)

    def keep(self, positions: list[int]) -> None:
        self.paths = keep_positions(self.paths, positions)

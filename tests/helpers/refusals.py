"""The battery form of a refused command: run as a user runs it (a subprocess), it exits
with status 2 and one ``error:`` line on stderr, no traceback, and changes no file."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path


def refused(*args: str, cwd: str | Path | None = None, timeout: float = 300) -> str:
    """Run ``layerdrop ARGS``; assert the one-line refusal; return that line."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).parents[2]),
                                                                     os.environ.get("PYTHONPATH")]))}
    result = subprocess.run([sys.executable, "-m", "framework.cli", *args], capture_output=True, text=True,
                            cwd=cwd, env=env, timeout=timeout)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, (result.returncode, result.stderr[-3000:])
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr[-3000:]
    assert "Traceback" not in result.stderr + result.stdout
    return lines[0]


def hashes(*roots: str | Path) -> dict[str, str]:
    """sha256 of every file under ``roots`` (a file root counts as itself), and every folder."""
    found: dict[str, str] = {}
    for root in map(Path, roots):
        paths = [root] if root.is_file() else sorted(root.rglob("*"))
        for path in paths:
            found[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "folder"
    return found

"""The reliability battery's checks, shared by the checkpoint tests: a command run as
a user runs it (a fresh interpreter, through the CLI front door), refused with exit
code 2 and one error line, no traceback, and nothing the user owns changed."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def layerdrop(*args: object, cwd: Path | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "framework.cli", *map(str, args)], capture_output=True, text=True,
                          env=env, cwd=cwd or REPO, timeout=timeout)


def refusal(done: subprocess.CompletedProcess) -> str:
    """The one error line of a refused command (asserting what a refusal is)."""
    assert done.returncode == 2, (done.returncode, done.stderr[-3000:])
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    lines = [line for line in done.stderr.splitlines() if "error:" in line]
    assert len(lines) == 1 and done.stderr.strip().splitlines()[-1] == lines[0], done.stderr[-3000:]
    return lines[0]


def hashes(*roots: Path) -> dict[str, str]:
    """sha256 of every file under ``roots`` (a file root counts itself), by path."""
    found = {}
    for root in roots:
        files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
        found.update({str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in files})
    return found


__all__ = ["layerdrop", "refusal", "hashes"]

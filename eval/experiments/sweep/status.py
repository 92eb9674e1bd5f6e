"""The sweep's periodic status line: each running run's step and ETA, read from the
progress lines `layerdrop pretrain` prints into <run>/logs/pretrain.log.

    sweep: 2 running — p_max=0.2,seed=0: step 420/1000 ETA 0:05:10; dense,seed=0: starting
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Callable

from framework.console.progress_line import latest_progress

TAIL_BYTES = 8192  # a progress line is ~60 bytes; a log's end holds the latest one


def log_tail(path: Path) -> list[str]:
    """The last lines of a log (the whole file is never read: logs grow across attempts)."""
    if not path.is_file():
        return []
    with open(path, "rb") as log:
        log.seek(max(0, path.stat().st_size - TAIL_BYTES))
        return log.read().decode(errors="replace").splitlines()


def status_line(logs: dict[str, Path]) -> str | None:
    """One line for the runs now training (run name -> its pretrain log); None when none is."""
    if not logs:
        return None
    parts = []
    for name, log in logs.items():
        progress = latest_progress(log_tail(log))
        if progress is None:
            parts.append(f"{name}: starting")
        else:
            eta = progress.eta_seconds
            parts.append(f"{name}: step {progress.step}/{progress.total} "
                         f"ETA {eta // 3600}:{eta // 60 % 60:02d}:{eta % 60:02d}")
    return f"sweep: {len(logs)} running — " + "; ".join(parts)


class StatusPrinter(threading.Thread):
    """Prints ``status_line(running())`` every ``every`` seconds, only when it changed."""

    def __init__(self, running: Callable[[], dict[str, Path]], every: float = 30.0,
                 emit: Callable[[str], None] = lambda line: print(line, flush=True)) -> None:
        super().__init__(daemon=True)
        self.running, self.every, self.emit = running, every, emit
        self.done = threading.Event()
        self.last: str | None = None

    def run(self) -> None:
        while not self.done.wait(self.every):
            line = status_line(self.running())
            if line is not None and line != self.last:
                self.emit(line)
            self.last = line

    def stop(self) -> None:
        self.done.set()


__all__ = ["status_line", "log_tail", "StatusPrinter"]

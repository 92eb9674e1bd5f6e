"""Progress display with the right totals, for training and for every long command.

``progress(total, what)`` wraps a loop: on a terminal a rich bar on stderr; in a log
(stderr not a terminal) one line every ``every`` seconds and one at the end, so a
command that runs for minutes never looks stalled and never floods a log file.
(A training run's progress: framework/training/progress.py.)
"""

from __future__ import annotations

import sys
import time
from contextlib import contextmanager
from typing import Iterable, Iterator



class _Lines:
    """Periodic progress lines for logs."""

    def __init__(self, total: int | None, what: str, every: float, stream) -> None:
        self.total, self.what, self.every, self.stream = total, what, every, stream
        self.done, self.started = 0, time.perf_counter()
        self.last, self.shown = self.started, -1

    def advance(self, count: int = 1) -> None:
        self.done += count
        now = time.perf_counter()
        if now - self.last >= self.every:
            self.last = now
            self._line(now)

    def finish(self) -> None:
        # Short runs stay silent; a long one ends with its final count (once).
        if time.perf_counter() - self.started >= self.every and self.done != self.shown:
            self._line(time.perf_counter())

    def _line(self, now: float) -> None:
        self.shown = self.done
        elapsed = now - self.started
        share = f"/{self.total} ({self.done / self.total:.0%})" if self.total else ""
        # The remaining time at the mean rate so far: only where the total is known.
        left = self.total - self.done if self.total else 0
        eta = f", ETA {elapsed / self.done * left:.0f} s" if left > 0 and self.done else ""
        print(f"{self.what}: {self.done}{share} in {elapsed:.0f} s{eta}", file=self.stream, flush=True)


class _Bar:
    def __init__(self, total: int | None, what: str, stream) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn, TimeRemainingColumn

        self.bar = Progress("[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(),
                            TimeElapsedColumn(), TimeRemainingColumn(), console=Console(file=stream),
                            transient=True)
        self.task = self.bar.add_task(what, total=total)
        self.bar.start()

    def advance(self, count: int = 1) -> None:
        self.bar.advance(self.task, count)

    def finish(self) -> None:
        self.bar.stop()


LOG_EVERY = 10.0  # seconds between lines in a log


@contextmanager
def progress(total: int | None, what: str, *, enabled: bool = True, every: float | None = None,
             stream=None) -> Iterator[_Bar | _Lines | "_Silent"]:
    """``with progress(n, "eval exits: batches") as bar: ... bar.advance()``."""
    stream = stream or sys.stderr
    every = LOG_EVERY if every is None else every
    if not enabled:
        display: _Bar | _Lines | _Silent = _Silent()
    elif hasattr(stream, "isatty") and stream.isatty():
        display = _Bar(total, what, stream)
    else:
        display = _Lines(total, what, every, stream)
    try:
        yield display
    finally:
        display.finish()


class _Silent:
    def advance(self, count: int = 1) -> None:
        pass

    def finish(self) -> None:
        pass



class Advancing:
    """``items`` advancing a progress display by one as each is read (iterable many times)."""

    def __init__(self, items: Iterable, bar) -> None:
        self.items, self.bar = items, bar

    def __iter__(self) -> Iterator:
        for item in self.items:
            yield item
            self.bar.advance()

def shown(items: Iterable, total: int | None, what: str) -> Iterator:
    """``items`` read once, with a progress display of their own: one pass of several
    over the same data gets its own name and total."""
    with progress(total, what) as bar:
        for item in items:
            yield item
            bar.advance()


__all__ = ["Advancing", "progress", "shown"]

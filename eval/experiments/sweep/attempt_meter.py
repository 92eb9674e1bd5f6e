"""A stage's CPU time while its child runs, so an attempt that a machine's end kills still counts.

The sweep takes each stage's CPU seconds from the child's rusage when it reaps it (runner.reap).
A sweep killed outright (a session's end, a lost node, SIGKILL) reaps nothing, and the hours
its attempt ran would vanish from status.json and from the report's CPU-hours: a 20-TPP run
that spans two sessions counted only the second. So while a child runs, ``AttemptMeter``
samples the CPU time of it and its descendants (psutil) every few seconds and hands it to a
callback that writes it beside the stage as ``in_flight``; the stage's next attempt folds an
``in_flight`` it finds into the totals as a killed attempt (``stage_entry``), and a finished
attempt replaces it with its exact rusage.
"""

from __future__ import annotations

import threading
import time
from typing import Callable

import psutil


def tree_cpu_seconds(pid: int) -> float | None:
    """User + system seconds of ``pid``, the children it has reaped, and its live descendants
    (torch.compile's workers); None once it is gone or a zombie."""
    try:
        process = psutil.Process(pid)
        times = process.cpu_times()
        total = times.user + times.system + times.children_user + times.children_system
        for child in process.children(recursive=True):
            try:
                own = child.cpu_times()
            except psutil.Error:  # it ended between the listing and the look
                continue
            total += own.user + own.system
        return total
    except psutil.Error:
        return None


class AttemptMeter:
    """Calls ``report(cpu_seconds, wall_seconds)`` every ``every`` seconds while running."""

    def __init__(self, pid: int, report: Callable[[float, float], None], every: float) -> None:
        self.pid, self.report, self.every = pid, report, every
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._watch, name=f"attempt-meter {pid}", daemon=True)

    def start(self) -> AttemptMeter:
        self.thread.start()
        return self

    def stop(self) -> None:
        """Before the child is reaped: its pid cannot be another process's yet."""
        self.done.set()
        self.thread.join()

    def _watch(self) -> None:
        start = time.monotonic()
        while not self.done.wait(self.every):
            cpu = tree_cpu_seconds(self.pid)
            if cpu is not None:
                self.report(cpu, time.monotonic() - start)


def stage_entry(status: dict, stage: str) -> dict:
    """The stage's totals in status.json, with an ``in_flight`` left by an attempt that never
    finished (the sweep was killed) folded in as a killed attempt."""
    entry = status.setdefault("stages", {}).setdefault(
        stage, {"cpu_seconds": 0.0, "wall_seconds": 0.0, "attempts": 0})
    lost = entry.pop("in_flight", None)
    if lost:
        entry["cpu_seconds"] += lost["cpu_seconds"]
        entry["wall_seconds"] += lost["wall_seconds"]
        entry["attempts"] += 1
        entry["killed_attempts"] = entry.get("killed_attempts", 0) + 1
    return entry


__all__ = ["AttemptMeter", "stage_entry", "tree_cpu_seconds"]

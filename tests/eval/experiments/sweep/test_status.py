"""The sweep's status line, read from fake pretrain logs in the real progress format."""

from __future__ import annotations

import threading

from eval.experiments.sweep.status import StatusPrinter, status_line
from framework.console.progress_line import ProgressLine, format_progress_line


def test_the_status_line_shows_each_running_runs_latest_step_and_eta(tmp_path):
    log = tmp_path / "pretrain.log"
    lines = ["$ layerdrop pretrain ...", format_progress_line(ProgressLine(10, 1000, 5.1, 900, 700)),
             "some warning", format_progress_line(ProgressLine(420, 1000, 4.3, 51234, 310))]
    log.write_text("x" * 20000 + "\n" + "\n".join(lines) + "\n")  # longer than the tail that is read
    line = status_line({"lr=0.004,seed=0": log, "dense,seed=1": tmp_path / "missing.log"})
    assert line == "sweep: 2 running — lr=0.004,seed=0: step 420/1000 ETA 0:05:10; dense,seed=1: starting"
    assert status_line({}) is None


def test_the_printer_prints_only_when_the_line_changed(tmp_path):
    log = tmp_path / "pretrain.log"
    log.write_text(format_progress_line(ProgressLine(1, 10, 5.0, 100, 9)) + "\n")
    printed: list[str] = []
    ticks = threading.Semaphore(0)

    def running():
        ticks.release()
        return {"a": log}

    printer = StatusPrinter(running, every=0.01, emit=printed.append)
    printer.start()
    for _ in range(5):  # at least four ticks on an unchanged log after the first: one line
        ticks.acquire()
    with open(log, "a") as out:
        out.write(format_progress_line(ProgressLine(2, 10, 4.0, 100, 8)) + "\n")
    for _ in range(500):
        if len(printed) >= 2:
            break
        ticks.acquire()
    for _ in range(5):  # and more ticks on the changed log: no repeat
        ticks.acquire()
    printer.stop()
    printer.join()
    assert printed == ["sweep: 1 running — a: step 1/10 ETA 0:00:09", "sweep: 1 running — a: step 2/10 ETA 0:00:08"]

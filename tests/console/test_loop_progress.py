"""Progress of a command's loop: periodic lines in logs, silence when short or disabled."""

from __future__ import annotations

import io

from framework.console.loop_progress import progress


def test_a_log_gets_periodic_lines_with_the_total():
    log = io.StringIO()
    with progress(3, "eval exits: batches", every=0.0, stream=log) as bar:
        for _ in range(3):
            bar.advance()
    lines = log.getvalue().splitlines()
    assert [line.split(" in ")[0] for line in lines] == ["eval exits: batches: 1/3 (33%)",
                                                         "eval exits: batches: 2/3 (67%)",
                                                         "eval exits: batches: 3/3 (100%)"]  # not twice at the end


def test_a_short_run_or_a_disabled_display_stays_silent():
    log = io.StringIO()
    with progress(2, "quick", stream=log) as bar:
        bar.advance(2)
    with progress(2, "off", enabled=False, every=0.0, stream=log) as bar:
        bar.advance(2)
    assert log.getvalue() == ""


def test_a_line_with_a_known_total_gives_the_time_left_and_the_last_none(monkeypatch):
    clock = iter([0.0, 10.0, 10.0, 20.0, 20.0])  # start; then (advance, line) twice
    monkeypatch.setattr("framework.console.loop_progress.time.perf_counter", lambda: next(clock))
    log = io.StringIO()
    with progress(4, "eval downstream: requests", every=5.0, stream=log) as bar:
        bar.advance(1)    # 1 of 4 in 10 s: 30 s left
        bar.advance(3)    # done: no ETA
    assert log.getvalue().splitlines() == ["eval downstream: requests: 1/4 (25%) in 10 s, ETA 30 s",
                                           "eval downstream: requests: 4/4 (100%) in 20 s"]


def test_a_line_without_a_total_has_no_eta():
    log = io.StringIO()
    with progress(None, "reading", every=0.0, stream=log) as bar:
        bar.advance()
    assert "ETA" not in log.getvalue()

"""Progress of a command's loop: periodic lines in logs, silence when short or disabled."""

from __future__ import annotations

import io

from framework.loop_progress import progress


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

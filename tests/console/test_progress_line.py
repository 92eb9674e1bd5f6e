"""The pretraining progress line: its exact form, and the parser that reads it back."""

from __future__ import annotations

import math

from framework.console.progress_line import ProgressLine, format_progress_line, latest_progress, parse_progress_line


def test_the_exact_form_and_its_round_trip():
    line = ProgressLine(step=120, total=1000, loss=4.31719, tokens_per_sec=51234.4, eta_seconds=3 * 3600 + 4 * 60 + 5)
    text = format_progress_line(line)
    assert text == "step 120/1000, loss 4.3172, tokens/s 51234, ETA 3:04:05"
    assert parse_progress_line(text) == ProgressLine(120, 1000, 4.3172, 51234.0, 11045)


def test_a_loss_that_is_not_finite_and_a_long_eta_still_parse():
    text = format_progress_line(ProgressLine(1, 10, math.nan, 0.0, 30 * 3600))
    assert text == "step 1/10, loss nan, tokens/s 0, ETA 30:00:00"
    parsed = parse_progress_line(text)
    assert math.isnan(parsed.loss) and parsed.eta_seconds == 30 * 3600


def test_other_lines_are_not_progress_and_the_latest_one_wins():
    log = ["Seed set to 1234", "step 1/6, loss 5.7000, tokens/s 900, ETA 0:00:10", "validation: 2 batches",
           "step 4/6, loss 5.1000, tokens/s 950, ETA 0:00:03", "step 4/6, loss oops", ""]
    assert parse_progress_line(log[0]) is None and parse_progress_line(log[4]) is None
    assert latest_progress(log).step == 4
    assert latest_progress(["nothing yet"]) is None

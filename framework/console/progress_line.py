"""The progress line a pretraining run prints into a log, and its parser: one spelling.

When its stdout is not a terminal (SLURM, nohup, a sweep's logs/pretrain.log),
`layerdrop pretrain` prints, every ``progress_every`` seconds (framework/training/progress.py):

    step 120/1000, loss 4.3172, tokens/s 51234, ETA 0:04:12
    step 120/1000, loss 4.3172, tokens/s 51234, ETA 0:04:12, sources code 1.2M (31%), prose 2.6M (69%)

step: optimizer steps done / ``trainer.max_steps``; loss: the last step's training loss;
tokens/s: over all devices since the previous line (validation time left out); ETA:
H:MM:SS at the pace of this run so far; sources (a data mixture only): tokens trained on per
source and their shares, summed over ranks every ``trainer.log_every_n_steps`` steps. Tools that follow a run (`layerdrop sweep`)
read it back with ``parse_progress_line`` / ``latest_progress``; this module needs only
the standard library, so they do not import Lightning to do so.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Iterable

_NUMBER = r"[-+]?(?:\d+(?:\.\d*)?|nan|inf)"
_LINE = re.compile(rf"step (\d+)/(\d+), loss ({_NUMBER}), tokens/s (\d+), ETA (\d+):(\d\d):(\d\d)"
                   r"(?:, sources (.+))?")


@dataclass(frozen=True)
class ProgressLine:
    step: int
    total: int
    loss: float
    tokens_per_sec: float
    eta_seconds: int
    sources: str | None = None


def format_progress_line(line: ProgressLine) -> str:
    eta = max(0, int(round(line.eta_seconds)))
    loss = f"{line.loss:.4f}" if math.isfinite(line.loss) else str(line.loss)
    sources = f", sources {line.sources}" if line.sources else ""
    return (f"step {line.step}/{line.total}, loss {loss}, tokens/s {max(0, round(line.tokens_per_sec))}, "
            f"ETA {eta // 3600}:{eta // 60 % 60:02d}:{eta % 60:02d}{sources}")


def parse_progress_line(text: str) -> ProgressLine | None:
    """The progress line ``text`` holds (surrounding whitespace ignored), else None."""
    match = _LINE.fullmatch(text.strip())
    if match is None:
        return None
    step, total, loss, tokens, hours, minutes, seconds, sources = match.groups()
    return ProgressLine(int(step), int(total), float(loss), float(tokens),
                        int(hours) * 3600 + int(minutes) * 60 + int(seconds), sources)


def latest_progress(lines: Iterable[str]) -> ProgressLine | None:
    """The last progress line among ``lines`` (e.g. a log file's), else None."""
    latest = None
    for text in lines:
        latest = parse_progress_line(text) or latest
    return latest


__all__ = ["ProgressLine", "format_progress_line", "parse_progress_line", "latest_progress"]

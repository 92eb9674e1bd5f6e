"""What lm-eval prints that a user of `layerdrop eval downstream` cannot act on, kept out of
its output (the Lightning and Hugging Face noise is framework/console/library_noise.py's):

- ``[Task: copa] metric acc is defined, but aggregation is not. using default
  aggregation=mean`` (and ``higher_is_better``): lm-eval's warning about its own task files,
  logged whenever such a task is built; the defaults it names are the right ones for
  every packaged task; and its advice to pass ``--metadata``, logged for every task whose
  data comes from a ``custom_dataset`` (every packaged one: eval/downstream/packaged_tasks.py);
- ``bootstrapping for stddev: perplexity``: a bare ``print`` before each bootstrap of a
  standard error (the report holds the error; ``--bootstrap-iters`` sets the resamples);
- ``fatal: not a git repository …``: git's stderr, from the ``git describe`` lm-eval runs
  to record the commit of the working directory (outside a repository it finds none, and
  says so on the terminal). The same command runs with its stderr discarded; the hash it
  finds in a repository is recorded as before.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import subprocess
import sys
from typing import Any, Callable, Iterator

# lm-eval's task module logs the defaults it applies to a task file's metric list, and its
# advice for tasks with a custom data set.
TASK_LOGGER = "lm_eval.api.task"
TASK_DEFAULTS = ("is defined, but aggregation is not", "is defined, but higher_is_better is not")
HUB_ADVICE = "Custom kwargs can be passed to `--metadata`"
# What lm-eval prints to stdout before a bootstrap.
BOOTSTRAP_LINE = "bootstrapping for stddev:"


class _DropTaskWarnings(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        message = str(record.msg)
        defaults = message.startswith("[Task: ") and any(text in message for text in TASK_DEFAULTS)
        return not (defaults or HUB_ADVICE in message)


def quiet_task_warnings() -> None:
    """Drop the task-defaults warnings and the hub advice (idempotent; imports no library)."""
    logger = logging.getLogger(TASK_LOGGER)
    if not any(isinstance(f, _DropTaskWarnings) for f in logger.filters):
        logger.addFilter(_DropTaskWarnings())


class _WithoutBootstrapLines(io.TextIOBase):
    """A text stream passing whole lines to ``target``, except lm-eval's bootstrap lines."""

    def __init__(self, target: Any) -> None:
        self.target, self.pending = target, ""

    def write(self, text: str) -> int:
        self.pending += text
        *lines, self.pending = self.pending.split("\n")
        for line in lines:
            if not line.startswith(BOOTSTRAP_LINE):
                self.target.write(line + "\n")
        return len(text)

    def flush(self) -> None:
        if self.pending and not self.pending.startswith(BOOTSTRAP_LINE):
            self.target.write(self.pending)
        self.pending = ""
        self.target.flush()


def _git_commit_hash() -> str | None:
    """lm-eval's ``get_git_commit_hash`` with git's stderr discarded."""
    from lm_eval.loggers.utils import get_commit_from_path

    try:
        return subprocess.check_output(["git", "describe", "--always"], stderr=subprocess.DEVNULL).strip().decode()
    except (subprocess.CalledProcessError, FileNotFoundError):
        return get_commit_from_path(os.getcwd())


@contextlib.contextmanager
def quiet_lm_eval() -> Iterator[None]:
    """Around ``lm_eval.simple_evaluate``: no bootstrap lines on stdout, no git error on stderr."""
    import lm_eval.evaluator

    quiet_task_warnings()
    original: Callable[[], Any] = lm_eval.evaluator.get_git_commit_hash
    lm_eval.evaluator.get_git_commit_hash = _git_commit_hash
    stream = _WithoutBootstrapLines(sys.stdout)
    try:
        with contextlib.redirect_stdout(stream):
            yield
    finally:
        stream.flush()
        lm_eval.evaluator.get_git_commit_hash = original


__all__ = ["quiet_task_warnings", "quiet_lm_eval", "TASK_DEFAULTS", "HUB_ADVICE", "BOOTSTRAP_LINE"]

"""The argument parser of every `layerdrop` command: argparse, with the project's error form.

argparse answers a bad flag with the command's whole usage block (often 9+ lines) and
then the line that matters. A `layerdrop` command answers with that one line, naming
where the usage is instead, as `layerdrop pretrain` (LightningCLI) does:

    error: argument --batches: invalid int value: 'x'; see layerdrop eval exits --help

and exits with status 2, argparse's status for a usage error. The checks a command runs
after parsing (``parser.error(...)``, e.g. eval/options.py) print the same way.
"""

from __future__ import annotations

import argparse
import sys


def error_line(message: str, prog: str) -> str:
    """The one line of a refused command line (whitespace folded: some messages wrap)."""
    return f"error: {' '.join(str(message).split())}; see {prog} --help"


class CommandParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` whose errors are one line on stderr, then exit 2."""

    def error(self, message: str):  # type: ignore[override]
        print(error_line(message, self.prog), file=sys.stderr, flush=True)
        sys.exit(2)


__all__ = ["CommandParser", "error_line"]

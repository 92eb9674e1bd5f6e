"""A command's ``main`` run in this process, as the shell would see it: its exit code (a
``SystemExit`` from argparse or a refusal included) and what it printed."""

from __future__ import annotations

from typing import Callable


def run_main(main: Callable[[list[str]], int | None], argv, capsys) -> tuple[int | str | None, object]:
    capsys.readouterr()
    try:
        code = main([str(a) for a in argv])
    except SystemExit as exit_:
        code = exit_.code
    return code, capsys.readouterr()

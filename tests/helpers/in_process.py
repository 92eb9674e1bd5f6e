"""A command's ``main`` run in this process, as the shell would see it: its exit code (a
``SystemExit`` from argparse or a refusal included) and what it printed."""

from __future__ import annotations

from typing import Callable

Main = Callable[[list[str]], "int | None"]


def exit_code(main: Main, argv) -> int | str | None:
    """``main(argv)``'s exit status (argparse and the refusals exit through SystemExit)."""
    try:
        return main([str(a) for a in argv])
    except SystemExit as exit_:
        return exit_.code


def run_main(main: Main, argv, capsys) -> tuple[int | str | None, object]:
    """The exit status and what the command printed (capsys's ``out`` and ``err``)."""
    capsys.readouterr()
    code = exit_code(main, argv)
    return code, capsys.readouterr()

"""The `layerdrop` front door, run as a user runs it: in a subprocess."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from framework import __version__
from framework.cli import COMMANDS

CONSOLE_SCRIPT = Path(sys.executable).with_name("layerdrop")


def run(*args: str, console_script: bool = False) -> subprocess.CompletedProcess:
    command = [str(CONSOLE_SCRIPT)] if console_script else [sys.executable, "-m", "framework.cli"]
    return subprocess.run(command + list(args), capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("args", [["--help"], ["-h"], []])
def test_help_lists_every_command(args):
    result = run(*args)
    assert result.returncode == 0, result.stderr
    assert "usage: layerdrop" in result.stdout
    for name in COMMANDS:
        assert name in result.stdout


def test_version():
    result = run("--version")
    assert result.returncode == 0
    assert result.stdout.strip() == f"layerdrop {__version__}"


def test_console_script_is_installed_and_routes():
    if not CONSOLE_SCRIPT.exists():
        pytest.skip(f"{CONSOLE_SCRIPT} is missing: the project is not installed in this interpreter's env")
    result = run("--version", console_script=True)
    assert (result.returncode, result.stdout.strip()) == (0, f"layerdrop {__version__}")
    assert "usage: layerdrop" in run("--help", console_script=True).stdout


@pytest.mark.parametrize("args, bad", [(["frobnicate"], "'frobnicate'"), (["eval", "nope"], "'nope'"),
                                       (["eval"], "(none)")])
def test_unknown_command_exits_2_with_one_line(args, bad):
    result = run(*args)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert bad in lines[0] and "allowed:" in lines[0]
    assert result.stdout == ""

"""The `layerdrop` front door, run as a user runs it: in a subprocess."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from framework import __version__
from framework.cli import COMMANDS
from framework.cli import main
from tests.helpers.in_process import exit_code
from tests.helpers.refusals import refused

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


@pytest.mark.parametrize("args, bad", [(["frobnicate"], "'frobnicate'"), (["eval", "nope"], "'nope'")])
def test_unknown_command_exits_2_with_one_line(args, bad):
    result = run(*args)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert bad in lines[0] and "allowed:" in lines[0]
    assert result.stdout == ""


@pytest.mark.parametrize("group", ["eval", "adapters", "speculate"])
@pytest.mark.parametrize("flag", ["--help", "-h", None])
def test_every_command_group_lists_its_subcommands(group, flag):
    """A group alone answers as `layerdrop` alone does: its usage, exit 0 (it used to say
    "unknown subcommand '(none)'" and exit 2)."""
    result = run(group, *([flag] if flag else []))
    assert result.returncode == 0, result.stderr
    assert f"usage: layerdrop {group} <subcommand>" in result.stdout
    members = [name for name in COMMANDS if name.startswith(group + " ")]
    assert members and all(f"  {name}  " in result.stdout for name in members)


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_command_refuses_a_bad_flag_in_one_line_pointing_to_its_help(name, capsys):
    """No usage block: the one ``error:`` line, naming where the usage is, status 2."""
    code = exit_code(main, [*name.split(), "--no-such-flag", "1"])
    captured = capsys.readouterr()
    assert code == 2
    assert captured.err.strip().splitlines() == [captured.err.strip()], captured.err
    assert captured.err.startswith("error: ") and captured.err.rstrip().endswith(f"see layerdrop {name} --help")


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_command_has_help(name, capsys):
    assert exit_code(main, [*name.split(), "--help"]) == 0
    assert f"usage: layerdrop {name}" in capsys.readouterr().out


def test_a_check_after_parsing_speaks_the_same_way(tmp_path):
    line = refused("eval", "exits", "--ckpt", str(tmp_path / "missing.ckpt"), "--data", str(tmp_path),
                   "--out", str(tmp_path / "r.json"))
    assert line == f"error: checkpoint {str(tmp_path / 'missing.ckpt')!r} does not exist; see layerdrop eval exits --help"

"""Shared fixtures of the data_prep tests: a small real corpus and a CLI runner."""

from __future__ import annotations

import os
import shutil
import sysconfig

import pytest

from data_prep.prepare import main
from tests.helpers.in_process import run_main

STDLIB = sysconfig.get_paths()["stdlib"]


@pytest.fixture(scope="session")
def code_corpus(tmp_path_factory) -> str:
    """~400 KB of real text: the .py files of the stdlib's json and email packages."""
    folder = tmp_path_factory.mktemp("code_corpus")
    for package in ("json", "email"):
        for name in sorted(os.listdir(os.path.join(STDLIB, package))):
            if name.endswith(".py"):
                shutil.copy(os.path.join(STDLIB, package, name), folder / f"{package}_{name}")
    return str(folder)


class PrepareRun:
    """Runs `layerdrop prepare` in-process; returns (exit code, stderr)."""

    def __init__(self, capsys) -> None:
        self.capsys = capsys

    def __call__(self, *argv: str) -> tuple[int, str]:
        code, printed = run_main(main, ["--no-progress", *argv], self.capsys)
        return code, printed.err


@pytest.fixture
def prepare(capsys) -> PrepareRun:
    return PrepareRun(capsys)



@pytest.fixture(scope="session")
def prepared(code_corpus, tmp_path_factory) -> str:
    """A small prepared folder (trained vocab 300, 30k tokens): its tokenizer is the given one of other tests."""
    out = str(tmp_path_factory.mktemp("prepared") / "data")
    assert main(["--files", code_corpus, "--vocab-size", "300", "--max-tokens", "30k", "--out", out,
                 "--no-progress"]) == 0
    return out

"""Fixtures shared by the whole suite.

``prepared_tokens`` is the one prepared data folder the tests that need real litdata
chunks read: made once per test session by whichever pytest-xdist worker gets there
first (the others wait on a file lock and reuse it), instead of once per test file.
Tests only read it.
"""

from __future__ import annotations

import sysconfig
from pathlib import Path

import pytest

from tiny_training import shared_once

# What `prepared_tokens` holds (tests size their models and checks from these).
TOKENS_VOCAB = 300
TOKENS_VAL_FRACTION = 0.1
TOKENS_CHUNK = 8192


@pytest.fixture(scope="session")
def shared_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder every xdist worker of this session sees (the parent of their base temps)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if base.name.startswith("popen-gw") else base


def prepare_tokens(out: Path) -> None:
    from data_prep.prepare import main as prepare

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    assert prepare(["--files", str(stdlib / "json" / "*.py"), "--files", str(stdlib / "email" / "*.py"),
                    "--tokenizer", "train", "--vocab-size", str(TOKENS_VOCAB), "--max-tokens", "200k",
                    "--val-fraction", str(TOKENS_VAL_FRACTION), "--chunk-tokens", str(TOKENS_CHUNK),
                    "--workers", "1", "--no-progress", "--out", str(out)]) == 0


@pytest.fixture(scope="session")
def prepared_tokens(shared_dir: Path) -> Path:
    """~200k tokens of real Python (the standard library's json and email packages)
    through `layerdrop prepare`: a trained byte-level BPE of 300 entries (EOS id 0),
    10% validation, chunks of 8192 tokens, plus manifest.json and tokenizer.json."""
    return shared_once(shared_dir, "prepared-tokens", lambda folder: prepare_tokens(folder / "tokens")) / "tokens"

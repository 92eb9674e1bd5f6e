"""Fixtures shared by the whole suite.

``prepared_tokens`` is the one prepared data folder the tests that need real litdata
chunks read: made once per test session by whichever pytest-xdist worker gets there
first (the others wait on a file lock and reuse it), instead of once per test file.
Tests only read it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.tiny_training import prepare_tiny_data, shared_once


# The one test longer than any two others (the README's and the guides' blocks, ~6 minutes): first of all.
LONGEST = "tests/test_readme.py::test_readme_runs_as_written"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The long tests first: the README's blocks, then the slow ones, then the multi-process ones,
    then the rest (each group in collection order). Under `make test`'s `--dist worksteal` a worker
    whose queue runs dry takes the other's short tests from the end of its queue, so no long test
    starts last while the other core idles (the suite's wall time is set by its tail)."""
    def rank(item: pytest.Item) -> int:
        if item.nodeid == LONGEST:
            return 0
        return 1 if item.get_closest_marker("slow") else 2 if item.get_closest_marker("multiprocess") else 3

    items.sort(key=rank)


@pytest.fixture(scope="session")
def shared_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder every xdist worker of this session sees (the parent of their base temps)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if base.name.startswith("popen-gw") else base


@pytest.fixture(scope="session")
def prepared_tokens(shared_dir: Path) -> Path:
    """The suite's prepared data (``tiny_training.prepare_tiny_data``): ~200k tokens of
    real Python, vocabulary 300 (EOS id 0), 10% validation, chunks of 8192 tokens, with
    manifest.json and tokenizer.json."""
    return shared_once(shared_dir, "prepared-tokens", lambda folder: prepare_tiny_data(folder / "tokens")) / "tokens"


@pytest.fixture(scope="session")
def mixture_sources(shared_dir: Path, prepared_tokens: Path) -> dict[str, str]:
    """Two prepared folders with one tokenizer, for data mixtures: the suite's json + email code
    (``prepared_tokens``) and the standard library's http package prepared with its tokenizer.json."""
    from tests.helpers.tiny_training import prepare_second_source

    made = shared_once(shared_dir, "mixture-http", lambda folder: prepare_second_source(prepared_tokens, folder / "http"))
    return {"email": str(prepared_tokens), "http": str(made / "http")}

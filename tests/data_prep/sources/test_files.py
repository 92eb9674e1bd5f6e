"""Text and code files as documents, and how a path, folder or glob names them."""

import pytest

from data_prep.errors import PrepareError
from data_prep.sources.document import SourceStats
from data_prep.sources.files import FileSource


def _read(source):
    stats = SourceStats()
    return [(doc.name, doc.text) for doc in source.documents(stats)], stats


def test_folder_walk_is_sorted_and_skips_hidden(tmp_path):
    (tmp_path / "b.txt").write_text("bee")
    (tmp_path / "a.txt").write_text("ay")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "c.py").write_text("print(1)")
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "config").write_text("hidden")
    (tmp_path / ".hidden.txt").write_text("hidden")
    docs, stats = _read(FileSource(str(tmp_path)))
    assert [text for _, text in docs] == ["ay", "bee", "print(1)"]
    assert stats.documents == 3 and stats.bytes == 2 + 3 + 8


def test_glob_with_recursion(tmp_path):
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "one.py").write_text("1")
    (tmp_path / "two.py").write_text("2")
    (tmp_path / "three.txt").write_text("3")
    docs, _ = _read(FileSource(str(tmp_path / "**" / "*.py")))
    assert sorted(text for _, text in docs) == ["1", "2"]


def test_binary_empty_and_invalid_utf8_files(tmp_path):
    (tmp_path / "a.bin").write_bytes(b"\x89PNG\x00\x00data")
    (tmp_path / "b.txt").write_text("  \n\t")
    (tmp_path / "c.txt").write_bytes(b"caf\xe9 latin-1")
    docs, stats = _read(FileSource(str(tmp_path)))
    assert [text for _, text in docs] == ["caf\ufffd latin-1"]
    assert (stats.skipped_binary, stats.skipped_empty, stats.invalid_utf8) == (1, 1, 1)


def test_missing_path_and_empty_glob_are_errors(tmp_path):
    with pytest.raises(PrepareError, match="no such file or folder"):
        FileSource(str(tmp_path / "nope"))
    with pytest.raises(PrepareError, match="matches no files"):
        FileSource(str(tmp_path / "*.md"))
    with pytest.raises(PrepareError, match="holds no files"):
        FileSource(str(tmp_path))


def test_keep_narrows_to_the_given_positions_in_order(tmp_path):
    for name in "abcd":
        (tmp_path / f"{name}.txt").write_text(name * 3)
    source = FileSource(str(tmp_path))
    source.keep([1, 3])
    assert [text for _, text in _read(source)[0]] == ["bbb", "ddd"] and source.describe()["files"] == 2

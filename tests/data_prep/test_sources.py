import gzip
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from data_prep.errors import PrepareError
from data_prep.sources import FileSource, JsonlSource, ParquetSource, SourceStats


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


def test_jsonl_documents_and_gzip(tmp_path):
    lines = [{"text": "first", "id": 1}, {"text": None}, {"text": "third"}]
    (tmp_path / "a.jsonl").write_text("\n".join(map(json.dumps, lines)) + "\n\n")
    with gzip.open(tmp_path / "b.jsonl.gz", "wt") as handle:
        handle.write(json.dumps({"text": "zipped"}) + "\n")
    docs, stats = _read(JsonlSource(str(tmp_path / "*.jsonl*"), "text"))
    assert docs == [(f"{tmp_path}/a.jsonl:1", "first"), (f"{tmp_path}/a.jsonl:3", "third"),
                    (f"{tmp_path}/b.jsonl.gz:1", "zipped")]
    assert stats.skipped_empty == 1


@pytest.mark.parametrize("line, message", [
    ('{"body": "x", "id": 2}', r"line 2 has no field 'text' \(it has: body, id\)"),
    ("[1, 2]", "line 2 has no field 'text'"),
    ("{not json", "line 2 is not valid JSON"),
    ('{"text": 5}', "field 'text' is a int, not a string"),
])
def test_jsonl_bad_lines_name_the_line(tmp_path, line, message):
    path = tmp_path / "data.jsonl"
    path.write_text('{"text": "ok"}\n' + line + "\n")
    with pytest.raises(PrepareError, match=message):
        _read(JsonlSource(str(path), "text"))


def test_parquet_rows_and_nulls(tmp_path):
    path = tmp_path / "part.parquet"
    pq.write_table(pa.table({"content": ["a doc", None, "another"], "n": [1, 2, 3]}), path)
    docs, stats = _read(ParquetSource(str(path), "content"))
    assert [text for _, text in docs] == ["a doc", "another"]
    assert stats.skipped_empty == 1


def test_parquet_column_is_checked_up_front(tmp_path):
    path = tmp_path / "part.parquet"
    pq.write_table(pa.table({"content": ["a"], "n": [1]}), path)
    with pytest.raises(PrepareError, match=r"has no column 'text' \(it has: content, n\)"):
        ParquetSource(str(path), "text")
    with pytest.raises(PrepareError, match="column 'n' is int64, not a string column"):
        ParquetSource(str(path), "n")
    (tmp_path / "bad.parquet").write_text("not parquet")
    with pytest.raises(PrepareError, match="not a readable Parquet file"):
        ParquetSource(str(tmp_path / "bad.parquet"), "content")

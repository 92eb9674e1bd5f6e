"""A string column of Parquet files as documents, its type checked up front."""

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from data_prep.errors import PrepareError
from data_prep.sources.columns import ParquetSource
from data_prep.sources.document import SourceStats


def _read(source):
    stats = SourceStats()
    return [(doc.name, doc.text) for doc in source.documents(stats)], stats


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

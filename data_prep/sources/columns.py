"""A string column of columnar files, one document per non-null value: Parquet files
(``--parquet``) and the Arrow IPC / Parquet shards of a ``datasets`` folder
(data_prep/sources/hf_dataset.py). The column's type is checked per file from its
schema alone (cheap, before any work); a typed string column then holds strings or nulls
only, so its rows need no checking pass."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator

from data_prep.errors import PrepareError
from data_prep.sources.document import Document, SourceStats, accept
from data_prep.sources.paths import PatternFiles

BATCH_ROWS = 1024


def _is_string(column_type) -> bool:
    import pyarrow as pa

    string_view = getattr(pa.types, "is_string_view", lambda _: False)  # pyarrow >= 16
    return pa.types.is_string(column_type) or pa.types.is_large_string(column_type) or string_view(column_type)


def check_text_column(schema, column: str, where: str) -> None:
    """PrepareError unless ``schema`` has ``column`` and it holds strings (``where``: the file, for the message)."""
    if column not in schema.names:
        raise PrepareError(f"{where} has no column {column!r} (it has: {', '.join(schema.names)}); "
                           "choose it with --text-column")
    column_type = schema.field(column).type
    if not _is_string(column_type):
        raise PrepareError(f"{where}: column {column!r} is {column_type}, not a string column")


def parquet_schema(path: str, where: str):
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        return pq.read_schema(path)
    except (pa.ArrowException, OSError) as error:
        raise PrepareError(f"{where}: not a readable Parquet file ({error})") from None


def arrow_schema(path: str, where: str):
    import pyarrow as pa

    try:
        with pa.memory_map(path) as source, _arrow_reader(source) as reader:
            return reader.schema
    except (pa.ArrowException, OSError) as error:
        raise PrepareError(f"{where}: not a readable Arrow IPC file ({error})") from None


def _arrow_reader(source):
    """An Arrow IPC stream (what ``datasets`` writes) or an IPC file (Feather v2)."""
    import pyarrow as pa

    try:
        return pa.ipc.open_stream(source)
    except pa.ArrowInvalid:
        source.seek(0)
        return pa.ipc.open_file(source)


def is_parquet(path: str) -> bool:
    return path.endswith(".parquet")


def _batches(path: str, column: str, parquet: bool) -> Iterator:
    import pyarrow as pa
    import pyarrow.parquet as pq

    if parquet:
        for batch in pq.ParquetFile(path).iter_batches(columns=[column], batch_size=BATCH_ROWS):
            yield batch.column(0)
        return
    with pa.memory_map(path) as source, _arrow_reader(source) as reader:
        if isinstance(reader, pa.ipc.RecordBatchFileReader):
            batches = (reader.get_batch(i) for i in range(reader.num_record_batches))
        else:
            batches = iter(reader)
        for batch in batches:
            values = batch.column(column)
            for start in range(0, len(values), BATCH_ROWS):  # datasets writes batches of ~1,000-10,000 rows
                yield values.slice(start, BATCH_ROWS)


def column_documents(paths: list[str], column: str, stats: SourceStats,
                     parquet: Callable[[str], bool] = is_parquet) -> Iterator[Document]:
    """Every non-empty value of ``column`` in ``paths``, in order: Parquet files where
    ``parquet(path)``, Arrow IPC files otherwise."""
    for path in paths:
        row = 0
        for values in _batches(path, column, parquet(path)):
            for text in values.to_pylist():
                row += 1
                if (doc := accept(text or "", f"{path}:{row}", stats)) is not None:
                    yield doc


@dataclass
class ParquetSource(PatternFiles):
    """Parquet files; every non-null value of the string column ``text_column`` is a document."""

    text_column: str = "text"
    flag = "--parquet"

    def __post_init__(self) -> None:
        super().__post_init__()
        for path in self.paths:
            where = f"{self.flag} {path!r}"
            check_text_column(parquet_schema(path, where), self.text_column, where)

    def describe(self) -> dict:
        return {"kind": "parquet", "pattern": self.pattern, "files": len(self.paths),
                "text_column": self.text_column}

    def documents(self, stats: SourceStats) -> Iterator[Document]:
        return column_documents(self.paths, self.text_column, stats, parquet=lambda _: True)

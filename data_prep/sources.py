"""Where documents come from: text/code files, JSONL records, Parquet rows.

Every source is resolved (paths exist, globs match, columns exist) when it is
built, so that bad input fails before any tokenizer training or encoding. Its
``documents(stats)`` generator yields the documents in a deterministic order and
counts what it skipped or repaired in ``stats``. The built-in corpus is a source too
(`data_prep.builtin_corpus`).
"""

from __future__ import annotations

import glob
import gzip
import json
import os
from dataclasses import dataclass, field
from typing import IO, Iterator, Protocol

from data_prep.errors import PrepareError

# A file whose first bytes hold a NUL is binary (an image, an archive, a .pyc): skipped.
BINARY_SNIFF_BYTES = 8192
_GLOB_CHARACTERS = set("*?[")


@dataclass(frozen=True)
class Document:
    text: str
    name: str  # where it came from, e.g. "stdlib:json/decoder.py" or "data.jsonl:17"


@dataclass
class SourceStats:
    """What one pass over a source saw; recorded per source in the manifest."""

    documents: int = 0
    bytes: int = 0
    invalid_utf8: int = 0  # documents decoded with U+FFFD replacements
    skipped_binary: int = 0
    skipped_empty: int = 0

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


class Source(Protocol):
    def describe(self) -> dict: ...

    def documents(self, stats: SourceStats) -> Iterator[Document]: ...


def check_every_record(sources: list[Source]) -> int:
    """Read every JSONL record once, raising PrepareError at the first bad one (a
    missing text field 20,000 lines in must not wait for a trained tokenizer). Returns
    the records checked. Parquet rows need no pass: their column's type was checked
    per file, and a typed column holds strings or nulls only."""
    return sum(source.check_records() for source in sources if isinstance(source, JsonlSource))


def decode_text(raw: bytes, stats: SourceStats) -> str:
    """UTF-8 text of ``raw``; invalid bytes become U+FFFD and the document is counted."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        stats.invalid_utf8 += 1
        return raw.decode("utf-8", errors="replace")


def accept(text: str, name: str, stats: SourceStats) -> Document | None:
    """The document, or None (counted) when it is empty or only whitespace."""
    if not text.strip():
        stats.skipped_empty += 1
        return None
    stats.documents += 1
    stats.bytes += len(text.encode("utf-8"))
    return Document(text=text, name=name)


def _has_glob(pattern: str) -> bool:
    return any(char in _GLOB_CHARACTERS for char in pattern)


def _walk_files(directory: str) -> list[str]:
    # Hidden files and folders (.git, .venv, .cache) are never corpus material.
    found = []
    for root, dirs, files in os.walk(directory):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        found += [os.path.join(root, f) for f in sorted(files) if not f.startswith(".")]
    return found


def resolve_paths(pattern: str, flag: str) -> list[str]:
    """Files named by ``pattern``: a file, a folder (all files below it) or a glob."""
    if _has_glob(pattern):
        matches = sorted(p for p in glob.glob(pattern, recursive=True) if os.path.isfile(p))
        if not matches:
            raise PrepareError(f"{flag} {pattern!r}: the glob matches no files")
        return matches
    if os.path.isdir(pattern):
        files = _walk_files(pattern)
        if not files:
            raise PrepareError(f"{flag} {pattern!r}: the folder holds no files")
        return files
    if os.path.isfile(pattern):
        return [pattern]
    raise PrepareError(f"{flag} {pattern!r}: no such file or folder")


def _open_maybe_gzip(path: str) -> IO[bytes]:
    return gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")


@dataclass
class FileSource:
    """Every file matched by a glob / folder / path is one document."""

    pattern: str
    paths: list[str] = field(init=False)

    def __post_init__(self) -> None:
        self.paths = resolve_paths(self.pattern, "--files")

    def describe(self) -> dict:
        return {"kind": "files", "pattern": self.pattern, "files": len(self.paths)}

    def documents(self, stats: SourceStats) -> Iterator[Document]:
        for path in self.paths:
            with open(path, "rb") as handle:
                raw = handle.read()
            if b"\x00" in raw[:BINARY_SNIFF_BYTES]:
                stats.skipped_binary += 1
                continue
            if (doc := accept(decode_text(raw, stats), path, stats)) is not None:
                yield doc


@dataclass
class JsonlSource:
    """One JSON object per line (optionally .gz); the document is its ``text_field``."""

    pattern: str
    text_field: str
    paths: list[str] = field(init=False)

    def __post_init__(self) -> None:
        self.paths = resolve_paths(self.pattern, "--jsonl")

    def describe(self) -> dict:
        return {"kind": "jsonl", "pattern": self.pattern, "files": len(self.paths),
                "text_field": self.text_field}

    def documents(self, stats: SourceStats) -> Iterator[Document]:
        for path, number, text in self._records(stats):
            if (doc := accept(text, f"{path}:{number}", stats)) is not None:
                yield doc

    def check_records(self) -> int:
        """Parse every line (raises PrepareError naming the first bad one); the count."""
        return sum(1 for _ in self._records(SourceStats()))

    def _records(self, stats: SourceStats) -> Iterator[tuple[str, int, str]]:
        for path in self.paths:
            with _open_maybe_gzip(path) as handle:
                for number, raw in enumerate(handle, start=1):
                    if raw.strip():
                        yield path, number, self._field(decode_text(raw, stats), path, number)

    def _field(self, line: str, path: str, number: int) -> str:
        where = f"{path} line {number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise PrepareError(f"{where} is not valid JSON ({error.msg})") from None
        if not isinstance(record, dict) or self.text_field not in record:
            keys = ", ".join(map(str, record)) if isinstance(record, dict) else type(record).__name__
            raise PrepareError(f"{where} has no field {self.text_field!r} (it has: {keys}); "
                               "choose the field with --text-field")
        value = record[self.text_field]
        if value is None:
            return ""
        if not isinstance(value, str):
            raise PrepareError(f"{where}: field {self.text_field!r} is a {type(value).__name__}, "
                               "not a string")
        return value


@dataclass
class ParquetSource:
    """Parquet files; every non-null value of the string column ``text_column`` is a document."""

    pattern: str
    text_column: str
    paths: list[str] = field(init=False)

    def __post_init__(self) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        self.paths = resolve_paths(self.pattern, "--parquet")
        for path in self.paths:
            try:
                schema = pq.read_schema(path)
            except (pa.ArrowException, OSError) as error:
                raise PrepareError(f"--parquet {path!r}: not a readable Parquet file ({error})") from None
            if self.text_column not in schema.names:
                raise PrepareError(f"--parquet {path!r} has no column {self.text_column!r} "
                                   f"(it has: {', '.join(schema.names)}); choose it with --text-column")
            column_type = schema.field(self.text_column).type
            if not (pa.types.is_string(column_type) or pa.types.is_large_string(column_type)):
                raise PrepareError(f"--parquet {path!r}: column {self.text_column!r} is {column_type}, "
                                   "not a string column")

    def describe(self) -> dict:
        return {"kind": "parquet", "pattern": self.pattern, "files": len(self.paths),
                "text_column": self.text_column}

    def documents(self, stats: SourceStats) -> Iterator[Document]:
        import pyarrow.parquet as pq

        for path in self.paths:
            row = 0
            for batch in pq.ParquetFile(path).iter_batches(columns=[self.text_column], batch_size=1024):
                for text in batch.column(0).to_pylist():
                    row += 1
                    if (doc := accept(text or "", f"{path}:{row}", stats)) is not None:
                        yield doc

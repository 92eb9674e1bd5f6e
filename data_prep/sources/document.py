"""What every source yields: a document (its text and where it came from), and what a
pass over a source counts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Protocol


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
    flag: str  # the command-line flag that names it (--files, --jsonl, ...)
    paths: list[str]  # the files it reads, in reading order

    def describe(self) -> dict: ...

    def documents(self, stats: SourceStats) -> Iterator[Document]: ...

    def keep(self, positions: list[int]) -> None: ...


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

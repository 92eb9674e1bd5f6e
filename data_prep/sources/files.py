"""Text and code files: every file matched by a glob / folder / path is one document."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

from data_prep.sources.document import Document, SourceStats, accept, decode_text
from data_prep.sources.paths import PatternFiles

# A file whose first bytes hold a NUL is binary (an image, an archive, a .pyc): skipped.
BINARY_SNIFF_BYTES = 8192


@dataclass
class FileSource(PatternFiles):
    flag = "--files"

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

"""JSON lines (plain, .gz or .zst): one JSON object per line, the document is its text field."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Iterator

from data_prep.errors import PrepareError
from data_prep.sources.compressed import read_lines
from data_prep.sources.document import Document, Source, SourceStats, accept, decode_text
from data_prep.sources.paths import PatternFiles


@dataclass
class JsonlSource(PatternFiles):
    text_field: str = "text"
    flag = "--jsonl"

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
            for number, raw in enumerate(read_lines(path, self.flag), start=1):
                if raw.strip():
                    yield path, number, self._field(decode_text(raw, stats), path, number)

    def _field(self, line: str, path: str, number: int) -> str:
        where = f"{path} line {number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise PrepareError(f"{where} is not valid JSON ({error.msg})") from None
        except RecursionError:  # the parser recurses once per level of [ or {
            raise PrepareError(f"{where} nests arrays or objects deeper than the JSON reader allows "
                               "(thousands of levels): not a document record") from None
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


def check_every_record(sources: list[Source]) -> int:
    """Read every JSONL record once, raising PrepareError at the first bad one (a
    missing text field 20,000 lines in, or a file cut short, must not wait for a trained
    tokenizer). Returns the records checked. Column sources need no pass: their column's
    type was checked per file, and a typed column holds strings or nulls only."""
    return sum(source.check_records() for source in sources if isinstance(source, JsonlSource))

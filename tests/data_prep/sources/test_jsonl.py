"""JSON lines as documents: plain, gzip and zstandard, and every bad line or stream refused
in one line naming the file."""

import gzip
import json

import pytest

from data_prep.errors import PrepareError
from data_prep.sources.document import SourceStats
from data_prep.sources.jsonl import JsonlSource


def _read(source):
    stats = SourceStats()
    return [(doc.name, doc.text) for doc in source.documents(stats)], stats


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

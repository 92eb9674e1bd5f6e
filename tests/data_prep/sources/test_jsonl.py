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


def test_jsonl_zst_reads_as_the_plain_file(tmp_path):
    import zstandard

    lines = [json.dumps({"text": f"document {i}\n" * (i % 5 + 1), "id": i}) for i in range(500)]
    (tmp_path / "a.jsonl").write_text("\n".join(lines) + "\n")
    (tmp_path / "a.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress((tmp_path / "a.jsonl").read_bytes()))
    plain, _ = _read(JsonlSource(str(tmp_path / "a.jsonl"), "text"))
    packed, _ = _read(JsonlSource(str(tmp_path / "a.jsonl.zst"), "text"))
    assert [text for _, text in packed] == [text for _, text in plain] and len(plain) == 500
    assert packed[3][0] == f"{tmp_path}/a.jsonl.zst:4"


@pytest.mark.parametrize("opening", ["[", '{"a": '])
def test_a_line_nested_thousands_deep_is_one_line_not_a_recursion_error(tmp_path, opening):
    path = tmp_path / "deep.jsonl"
    path.write_text('{"text": "ok"}\n' + opening * 50_000 + "\n")
    source = JsonlSource(str(path), "text")
    with pytest.raises(PrepareError, match="line 2 nests arrays or objects deeper than the JSON reader allows"):
        source.check_records()

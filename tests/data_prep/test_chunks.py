import json
import os

import numpy as np
import pytest

from data_prep.chunks import SplitChunkReader, chunk_count, read_split_tokens, write_split_chunks


@pytest.fixture
def stream(tmp_path):
    """A token file of 40 documents with random lengths, and the spans of every other one."""
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 300, size=40)
    tokens = np.arange(lengths.sum(), dtype=np.uint32) % 60000
    tokens.astype(np.uint16).tofile(tmp_path / "tokens.bin")
    ends = np.cumsum(lengths)
    spans = np.stack([ends - lengths, ends], axis=1)[::2]
    np.save(tmp_path / "spans.npy", spans)
    expected = np.concatenate([tokens[s:e] for s, e in spans]).astype(np.uint16)
    return str(tmp_path / "tokens.bin"), str(tmp_path / "spans.npy"), expected


@pytest.mark.parametrize("chunk_tokens", [1, 7, 256, 10_000])
def test_reader_gathers_the_split_stream(stream, chunk_tokens):
    tokens_path, spans_path, expected = stream
    reader = SplitChunkReader(tokens_path, "uint16", spans_path, chunk_tokens)
    chunks = [reader(k) for k in range(chunk_count(len(expected), chunk_tokens))]
    assert all(len(chunk) == chunk_tokens for chunk in chunks[:-1])
    assert np.array_equal(np.concatenate(chunks), expected)


def test_written_chunks_read_back_and_are_deterministic(stream, tmp_path):
    tokens_path, spans_path, expected = stream
    reader = SplitChunkReader(tokens_path, "uint16", spans_path, 500)
    outputs = []
    for name in ("a", "b"):
        out = str(tmp_path / name)
        assert write_split_chunks(reader, len(expected), out, workers=2) == chunk_count(len(expected), 500)
        assert np.array_equal(read_split_tokens(out, "uint16"), expected)
        outputs.append({f: open(os.path.join(out, f), "rb").read() for f in sorted(os.listdir(out))})
    assert outputs[0] == outputs[1]
    index = json.loads(outputs[0]["index.json"])
    assert index["config"]["item_loader"] == "TokensLoader"
    assert [chunk["dim"] for chunk in index["chunks"]][:-1] == [500] * (len(index["chunks"]) - 1)
    assert len(index["updated_at"]) == 32  # a content hash, not a time stamp

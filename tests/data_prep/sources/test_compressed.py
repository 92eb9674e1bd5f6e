"""Compressed inputs read whole or refused: zstandard frame by frame (a truncated stream
must not end quietly, as python-zstandard's stream_reader lets it), gzip likewise."""

import gzip
import subprocess

import pytest
import zstandard

from data_prep.errors import PrepareError
from data_prep.sources.compressed import READ_BYTES, read_lines


def _lines(count: int, width: int = 90) -> list[bytes]:
    return [f"{i:08d} ".encode() + bytes(97 + (i * 7 + j) % 26 for j in range(width)) + b"\n" for i in range(count)]


@pytest.fixture(scope="module")
def text() -> bytes:
    """~2.3 MB: more than two read blocks, so lines straddle block ends."""
    return b"".join(_lines(25_000))


def test_zstd_reads_back_every_line(tmp_path, text):
    path = tmp_path / "a.jsonl.zst"
    path.write_bytes(zstandard.ZstdCompressor(level=3).compress(text))
    assert len(text) > 2 * READ_BYTES
    assert b"".join(read_lines(str(path), "--jsonl")) == text


def test_zstd_command_output_and_concatenated_frames(tmp_path, text):
    """What the zstd command writes (with its checksum), and two streams back to back (pzstd, cat)."""
    plain = tmp_path / "a.jsonl"
    plain.write_bytes(text)
    subprocess.run(["zstd", "-q", "-f", str(plain), "-o", str(tmp_path / "a.jsonl.zst")], check=True)
    assert b"".join(read_lines(str(tmp_path / "a.jsonl.zst"), "--jsonl")) == text
    two = tmp_path / "two.jsonl.zstd"
    two.write_bytes((tmp_path / "a.jsonl.zst").read_bytes() + zstandard.ZstdCompressor().compress(b"last\n"))
    assert b"".join(read_lines(str(two), "--jsonl")) == text + b"last\n"


@pytest.mark.parametrize("keep", [0.1, 0.5, 0.999])
def test_a_truncated_zstd_stream_is_refused(tmp_path, text, keep):
    whole = zstandard.ZstdCompressor(write_checksum=True).compress(text)
    path = tmp_path / "cut.jsonl.zst"
    path.write_bytes(whole[:int(len(whole) * keep)])
    with pytest.raises(PrepareError, match=r"cut.jsonl.zst': not a complete zstandard stream \(it ends inside a "
                                           r"zstandard frame"):
        list(read_lines(str(path), "--jsonl"))


def test_a_second_frame_cut_short_is_refused(tmp_path):
    frame = zstandard.ZstdCompressor().compress(b'{"text": "a"}\n' * 100)
    path = tmp_path / "two.jsonl.zst"
    path.write_bytes(frame + frame[:len(frame) // 2])
    with pytest.raises(PrepareError, match="ends inside a zstandard frame"):
        list(read_lines(str(path), "--jsonl"))


@pytest.mark.parametrize("content, detail", [(b'{"text": "plain json"}\n', "Unknown frame descriptor"),
                                             (b"", "it is empty")])
def test_a_file_that_is_not_zstd_is_refused(tmp_path, content, detail):
    path = tmp_path / "x.jsonl.zst"
    path.write_bytes(content)
    with pytest.raises(PrepareError, match=f"not a complete zstandard stream.*{detail}"):
        list(read_lines(str(path), "--jsonl"))


def test_gzip_cut_short_or_not_gzip_is_refused(tmp_path, text):
    whole = gzip.compress(text)
    (tmp_path / "cut.jsonl.gz").write_bytes(whole[:len(whole) // 2])
    (tmp_path / "plain.jsonl.gz").write_bytes(text[:1000])
    assert b"".join(read_lines(_write(tmp_path / "ok.gz", whole), "--jsonl")) == text
    for name in ("cut.jsonl.gz", "plain.jsonl.gz"):
        with pytest.raises(PrepareError, match=f"--jsonl '.*{name}': not a complete gzip stream"):
            list(read_lines(str(tmp_path / name), "--jsonl"))


def _write(path, data: bytes) -> str:
    path.write_bytes(data)
    return str(path)


def test_the_file_is_closed_when_reading_stops_early(tmp_path, text):
    """A reader that stops after a few lines (a --max-tokens cap) leaves no open file behind."""
    import os

    path = tmp_path / "a.jsonl.zst"
    path.write_bytes(zstandard.ZstdCompressor().compress(text))
    lines = read_lines(str(path), "--jsonl")
    next(lines)
    before = len(os.listdir("/proc/self/fd"))
    lines.close()
    assert len(os.listdir("/proc/self/fd")) == before - 1

"""A file as the bytes it holds, line by line: plain, gzip (``.gz``) or zstandard
(``.zst``, ``.zstd``: Dolma, RedPajama and The Pile ship their JSON lines so), chosen by
the file name's ending.

A stream that is not what its name says, or that was cut short (a copy that died half
way), fails as one PrepareError naming the file, never as a decompressor's traceback
and never silently: python-zstandard's ``stream_reader`` returns what it could decode
of a truncated file and stops without a word, so zstandard streams are read here with a
decompression object per frame, and a stream whose last frame did not end is refused.
Files of several frames (concatenated streams, ``pzstd``) are read frame after frame.
"""

from __future__ import annotations

import gzip
import io
import zlib
from typing import Iterator

from data_prep.errors import PrepareError

ZSTD_SUFFIXES = (".zst", ".zstd")
READ_BYTES = 1 << 20


class _ZstdStream(io.RawIOBase):
    """The decompressed bytes of a zstandard file, as a readable raw stream."""

    def __init__(self, handle: io.BufferedReader) -> None:
        import zstandard

        self._handle, self._context = handle, zstandard.ZstdDecompressor()
        self._frame = self._context.decompressobj()
        self._pending = memoryview(b"")
        self._read_any = False

    def readable(self) -> bool:
        return True

    def close(self) -> None:
        if not self.closed:
            self._handle.close()
        super().close()

    def readinto(self, buffer) -> int:
        while not self._pending:
            block = self._handle.read(READ_BYTES)
            if not block:
                if not self._frame.eof:
                    raise _Truncated("it ends inside a zstandard frame (a truncated file?)" if self._read_any
                                     else "it is empty, not a zstandard stream")
                return 0
            self._pending = memoryview(self._decompress(block))
        size = min(len(buffer), len(self._pending))
        buffer[:size] = self._pending[:size]
        self._pending = self._pending[size:]
        return size

    def _decompress(self, block: bytes) -> bytes:
        self._read_any = True
        pieces = []
        while block:
            if self._frame.eof:  # the previous frame ended: the next one starts here
                self._frame = self._context.decompressobj()
            pieces.append(self._frame.decompress(block))
            block = self._frame.unused_data if self._frame.eof else b""
        return b"".join(pieces)


class _Truncated(Exception):
    pass


def _decompression_errors() -> tuple[type[BaseException], ...]:
    import zstandard

    # gzip: BadGzipFile (not gzip, bad CRC), EOFError (cut short), zlib.error (corrupt data)
    return (_Truncated, zstandard.ZstdError, gzip.BadGzipFile, EOFError, zlib.error)


def _open(path: str) -> io.BufferedIOBase:
    if path.endswith(".gz"):
        return gzip.open(path, "rb")
    handle = open(path, "rb")
    if path.endswith(ZSTD_SUFFIXES):
        return io.BufferedReader(_ZstdStream(handle), buffer_size=READ_BYTES)
    return handle


def _format(path: str) -> str:
    return "gzip" if path.endswith(".gz") else "zstandard" if path.endswith(ZSTD_SUFFIXES) else "plain"


def read_lines(path: str, flag: str) -> Iterator[bytes]:
    """The lines of ``path`` (decompressed by its ending), each with its newline."""
    errors = _decompression_errors()
    try:
        with _open(path) as handle:
            yield from handle
    except errors as error:
        detail = str(error) or type(error).__name__
        raise PrepareError(f"{flag} {path!r}: not a complete {_format(path)} stream ({detail})") from None

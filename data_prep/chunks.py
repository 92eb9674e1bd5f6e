"""One split's token stream -> litdata ``TokensLoader`` chunks (``optimize``, several workers).

Each optimize input is a chunk *number* k; the worker gathers the k-th run of
``chunk_tokens`` tokens of the split's stream (its documents, EOS-separated, in
corpus order) from ``tokens.bin``. One item per chunk means every chunk except the
last holds exactly ``chunk_tokens`` tokens, whatever the number of workers, and
``TokensLoader`` (whose blocks never straddle chunks) loses at most one block's
tail per chunk.

litdata stamps ``index.json`` with ``updated_at = time()``; readers only use it to
notice that a dataset changed (it names their cache folder). It is replaced by a
hash of the chunk files, which changes exactly when the data does and keeps two
identical runs byte-identical.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os

import numpy as np
from litdata import TokensLoader, optimize

from framework.files.atomic_write import write_text

INDEX_FILE = "index.json"


class SplitChunkReader:
    """``optimize``'s function: chunk number -> that chunk's tokens (picklable, lazy)."""

    def __init__(self, tokens_path: str, dtype: str, spans_path: str, chunk_tokens: int) -> None:
        self.tokens_path, self.dtype, self.spans_path = tokens_path, dtype, spans_path
        self.chunk_tokens = chunk_tokens
        self._tokens: np.ndarray | None = None

    def _load(self) -> None:
        self._tokens = np.memmap(self.tokens_path, dtype=self.dtype, mode="r")
        spans = np.load(self.spans_path)
        self._starts = spans[:, 0]
        self._offsets = np.concatenate([[0], np.cumsum(spans[:, 1] - spans[:, 0])])  # stream offsets

    def __call__(self, chunk: int) -> np.ndarray:
        if self._tokens is None:
            self._load()
        low = chunk * self.chunk_tokens
        high = min(low + self.chunk_tokens, int(self._offsets[-1]))
        doc = int(np.searchsorted(self._offsets, low, side="right")) - 1
        pieces = []
        while low < high:
            within = low - int(self._offsets[doc])
            take = min(high, int(self._offsets[doc + 1])) - low
            start = int(self._starts[doc]) + within
            pieces.append(self._tokens[start:start + take])
            low += take
            doc += 1
        return np.concatenate(pieces).astype(self.dtype, copy=False)


def chunk_count(num_tokens: int, chunk_tokens: int) -> int:
    return -(-num_tokens // chunk_tokens)


@contextlib.contextmanager
def _tokenizers_quiet_after_fork():
    # The workers are forked after the Rust tokenizer has used its thread pool; they
    # never tokenize, so tell `tokenizers` not to warn about it (restored afterwards).
    previous = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("TOKENIZERS_PARALLELISM", None)
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = previous


def write_split_chunks(reader: SplitChunkReader, num_tokens: int, output_dir: str, workers: int) -> int:
    """Write the chunks of one split into ``output_dir``; returns the number of chunks."""
    chunks = chunk_count(num_tokens, reader.chunk_tokens)
    with _tokenizers_quiet_after_fork():
        optimize(
            fn=reader,
            inputs=list(range(chunks)),
            output_dir=output_dir,
            chunk_size=reader.chunk_tokens,
            item_loader=TokensLoader(),
            num_workers=max(1, min(workers, chunks)),
            keep_data_ordered=True,  # static, ordered slices per worker: deterministic files
            reorder_files=False,
            start_method="fork",  # spawn would re-import torch in every worker (~3 s each)
            verbose=False,
        )
    stamp_index_with_content_hash(output_dir)
    return chunks


def stamp_index_with_content_hash(output_dir: str) -> None:
    path = os.path.join(output_dir, INDEX_FILE)
    with open(path) as handle:
        index = json.load(handle)
    digest = hashlib.sha256()
    for chunk in index["chunks"]:
        with open(os.path.join(output_dir, chunk["filename"]), "rb") as handle:
            digest.update(handle.read())
    index["updated_at"] = digest.hexdigest()[:32]
    write_text(path, json.dumps(index, sort_keys=True))


def read_split_tokens(split_dir: str, dtype: str) -> np.ndarray:
    """All tokens of a prepared split, in stream order (for inspection and tests).

    A chunk file is litdata's: a uint32 item count n, n + 1 uint32 offsets, then the
    items' bytes; the chunks are listed in stream order in ``index.json``.
    """
    with open(os.path.join(split_dir, INDEX_FILE)) as handle:
        index = json.load(handle)
    pieces = []
    for chunk in index["chunks"]:
        path = os.path.join(split_dir, chunk["filename"])
        items = int(np.fromfile(path, dtype=np.uint32, count=1)[0])
        pieces.append(np.fromfile(path, dtype=dtype, offset=(items + 2) * 4))
    return np.concatenate(pieces) if pieces else np.empty(0, dtype=dtype)


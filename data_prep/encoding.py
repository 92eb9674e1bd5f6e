"""Documents -> one flat token file (each document followed by EOS, and led by BOS under
the "bos" document start), with an exact cap.

The whole corpus is encoded once, in batches (the Rust tokenizer spreads a batch
over its threads), into ``tokens.bin`` in the staging folder, together with every
document's end offset and split key. Splitting and chunking then only move token
ranges around, so the token and document counts in the manifest are exact, a
``--max-tokens`` cap is exact (the last document is cut where the budget ends), and
memory stays flat however large the corpus is.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Iterable, Iterator

import numpy as np
from tokenizers import Tokenizer
from tqdm import tqdm

from data_prep.errors import PrepareError
from data_prep.sources.document import Document
from data_prep.split import SPLITS, TRAIN, VAL, split_key, split_of

BATCH_DOCUMENTS = 256
BATCH_CHARACTERS = 4_000_000
CHARACTERS_PER_TOKEN = 4


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 when every id fits in 16 bits (vocab ≤ 65,536), else uint32."""
    return np.dtype(np.uint16) if vocab_size <= 2**16 else np.dtype(np.uint32)


@dataclass
class EncodedCorpus:
    tokens_path: str
    dtype: np.dtype
    doc_ends: np.ndarray  # int64, end offset of every document in tokens.bin
    doc_keys: np.ndarray  # float64, split key of every document
    truncated: bool  # the last document was cut by --max-tokens

    @property
    def num_tokens(self) -> int:
        return int(self.doc_ends[-1]) if len(self.doc_ends) else 0

    def doc_splits(self, val_fraction: float, both_splits: bool = True) -> np.ndarray:
        """TRAIN/VAL per document, by its hash alone.

        ``both_splits``: each split gets at least one document: on a corpus so small that
        the hash puts nothing in one split, the document with the smallest (largest) key
        moves to val (train), still a function of the hashes alone. A part of a sharded
        corpus (``prepare --shard``) takes the hash's word only, so that the merged parts
        split exactly as one machine would; the merge checks that both splits are filled.
        """
        if both_splits and len(self.doc_keys) < 2:
            raise PrepareError(f"the corpus has {len(self.doc_keys)} document(s); a train/val split needs "
                               "at least 2 (add data or raise --max-tokens)")
        splits = np.array([split_of(key, val_fraction) for key in self.doc_keys], dtype=np.uint8)
        if both_splits and not (splits == VAL).any():
            splits[int(np.argmin(self.doc_keys))] = VAL
        if both_splits and not (splits == TRAIN).any():
            splits[int(np.argmax(self.doc_keys))] = TRAIN
        return splits

    def split_spans(self, val_fraction: float, both_splits: bool = True) -> dict[str, np.ndarray]:
        """For each split, the [start, end) token ranges of its documents, in corpus order."""
        starts = np.concatenate([[0], self.doc_ends])[:-1].astype(np.int64)
        spans = np.stack([starts, self.doc_ends], axis=1)
        splits = self.doc_splits(val_fraction, both_splits)
        return {name: spans[splits == index] for index, name in enumerate(SPLITS)}


def _next_batch(documents: Iterator[Document], max_characters: int) -> list[Document]:
    batch: list[Document] = []
    characters = 0
    for doc in documents:
        batch.append(doc)
        characters += len(doc.text)
        if len(batch) >= BATCH_DOCUMENTS or characters >= max_characters:
            break
    return batch


def _batch_characters(total: int, max_tokens: int | None) -> int:
    # Under a cap, read about what the remaining budget needs (a byte-level BPE rarely
    # packs more than CHARACTERS_PER_TOKEN characters in a token), not a full batch.
    if max_tokens is None:
        return BATCH_CHARACTERS
    return max(1, min(BATCH_CHARACTERS, (max_tokens - total) * CHARACTERS_PER_TOKEN))


def encode_documents(documents: Iterable[Document], tokenizer: Tokenizer, eos_id: int, dtype: np.dtype,
                     seed: int, tokens_path: str, max_tokens: int | None = None,
                     progress: bool = True, with_bos: bool = False) -> EncodedCorpus:
    """Encode every document (then EOS) into ``tokens_path``, stopping at ``max_tokens``.
    ``with_bos``: each document as the tokenizer's post-processor makes it (BOS first;
    framework/tokenizer.py's "bos" document start)."""
    ends: list[int] = []
    keys: list[float] = []
    total, truncated = 0, False
    documents = iter(documents)
    # A document that happens to contain the literal text of a special token (say
    # "<|endoftext|>" in code about tokenizers) is encoded as plain text: the only
    # EOS ids in the stream are the separators added here.
    tokenizer.encode_special_tokens = True
    bar = tqdm(total=max_tokens, unit="tok", unit_scale=True, desc="encode", file=sys.stderr,
               disable=None if progress else True, dynamic_ncols=True)  # None: only on a terminal
    with open(tokens_path, "wb") as out, bar:
        while batch := _next_batch(documents, _batch_characters(total, max_tokens)):
            encodings = tokenizer.encode_batch_fast([doc.text for doc in batch], add_special_tokens=with_bos)
            pieces = []
            for doc, encoding in zip(batch, encodings):
                ends_with_eos = with_bos and encoding.ids[-1:] == [eos_id]  # a post-processor that adds one
                ids = np.empty(len(encoding.ids) + (not ends_with_eos), dtype=dtype)
                ids[:len(encoding.ids)] = encoding.ids
                ids[-1] = eos_id
                if max_tokens is not None and total + len(ids) >= max_tokens:
                    truncated = total + len(ids) > max_tokens
                    ids = ids[: max_tokens - total]
                pieces.append(ids)
                total += len(ids)
                ends.append(total)
                keys.append(split_key(doc.text, seed))
                if max_tokens is not None and total >= max_tokens:
                    break
            np.concatenate(pieces).tofile(out)
            bar.update(sum(len(piece) for piece in pieces))
            if max_tokens is not None and total >= max_tokens:
                break
    return EncodedCorpus(tokens_path, dtype, np.asarray(ends, dtype=np.int64),
                         np.asarray(keys, dtype=np.float64), truncated)

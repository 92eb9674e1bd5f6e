"""The train/val split: a document's split is a pure function of its text and the seed.

``u = sha256(seed, text)`` read as a number in [0, 1); the document goes to val when
``u < val_fraction``. The rule is stable: adding documents to a corpus never moves an
existing one across the split, and identical documents (copies) land on the same
side, so validation never sees a verbatim copy of a training document.
"""

from __future__ import annotations

import hashlib

SPLITS = ("train", "val")
TRAIN, VAL = 0, 1


def split_key(text: str, seed: int) -> float:
    """The document's position in [0, 1) under the seeded hash."""
    digest = hashlib.sha256(f"{seed}\x00".encode() + text.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def split_of(key: float, val_fraction: float) -> int:
    return VAL if key < val_fraction else TRAIN

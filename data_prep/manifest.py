"""manifest.json: what a prepared folder holds and how it was made.

Read by `framework.data.TokenDataModule` (which checks ``tokenizer.vocab_size``
against the model and the token counts against the sequence length) and by people.
Keys::

    format              "layerdrop-tokens/1"
    command             the `layerdrop prepare ...` command line
    seed, val_fraction, max_tokens, chunk_tokens
    dtype               "uint16" | "uint32" (token storage in the chunks)
    tokenizer           {file, sha256, vocab_size, eos_token, eos_id, origin, trained_on?}
    sources             one entry per source: its description + what was read from it
                        {documents, bytes, invalid_utf8, skipped_binary, skipped_empty}
                        (under --max-tokens the last encoding batch is read whole, so
                        this can exceed the documents in the splits)
    invalid_utf8_documents   documents decoded with U+FFFD replacements (all sources)
    truncated_last_document  the --max-tokens cap cut the last document
    splits              {"train"|"val": {path, documents, tokens, chunks}}

No timestamps or host names: the same inputs and seed give a byte-identical file.
"""

from __future__ import annotations

import hashlib
import json
import os

MANIFEST_FILE = "manifest.json"
FORMAT = "layerdrop-tokens/1"


def sha256_of_file(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_manifest(folder: str, manifest: dict) -> str:
    path = os.path.join(folder, MANIFEST_FILE)
    with open(path, "w") as handle:
        json.dump(manifest, handle, indent=2)
        handle.write("\n")
    return path


def read_manifest(folder: str) -> dict:
    with open(os.path.join(folder, MANIFEST_FILE)) as handle:
        return json.load(handle)

"""manifest.json: what a prepared folder holds and how it was made.

Written by `layerdrop prepare` (data_prep/prepare.py); read by
`framework.training.data.TokenDataModule` (which checks ``tokenizer.vocab_size`` against the
model and the token counts against the sequence length) and by people. This module
is the schema's one home: its name, its format string, reading (local or from an
object store) and writing.
Keys::

    format              "layerdrop-tokens/1"
    command             the `layerdrop prepare ...` command line
    seed, val_fraction, max_tokens, chunk_tokens
    dtype               "uint16" | "uint32" (token storage in the chunks)
    tokenizer           {file, sha256, vocab_size, eos_token, eos_id, bos_token?, bos_id?,
                         document_start ("bos" | "eos", framework/tokenizer.py), origin (the given
                         file or folder, or "trained"), trained_on? {documents, bytes, corpus?}}
                        (sources of one mixture must agree on sha256, eos_id and document_start)
    sources             one entry per source: its description (kind files | jsonl | parquet |
                        hf_dataset | builtin, the last with corpus builtin | builtin:code |
                        builtin:prose) + what was read from it
                        {documents, bytes, invalid_utf8, skipped_binary, skipped_empty}
                        (under --max-tokens the last encoding batch is read whole, so
                        this can exceed the documents in the splits; in a part of --shard,
                        the description is the whole input's and "read" the part's)
    invalid_utf8_documents   documents decoded with U+FFFD replacements (all sources)
    truncated_last_document  the --max-tokens cap cut the last document
    shard?              a part of `prepare --shard I/N`: {index, count, files, corpus_files, bytes,
                        corpus_sha256 (the whole input's and the options' fingerprint)}
    merged?             made by `prepare merge`: {count, corpus_sha256, parts (their commands)}
    splits              {"train"|"val": {path, documents, tokens, chunks}} (in a part, a split
                        without documents has chunks 0 and no folder)

Keys are only ever added: a manifest written before a key existed reads as it did.
No timestamps or host names: the same inputs and seed give a byte-identical file.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile

from framework.files.atomic_write import write_json
from framework.files.staging import is_url

MANIFEST_FILE = "manifest.json"
MANIFEST_FORMAT = "layerdrop-tokens/1"


def read_manifest(data_dir: str, storage_options: dict | None = None) -> dict:
    """The manifest of a prepared folder (local or remote); a clear error when absent."""
    hint = f"no {MANIFEST_FILE} in {data_dir!r}: is it a folder made by `layerdrop prepare ... --out DIR`?"
    if not is_url(data_dir):
        path = os.path.join(data_dir, MANIFEST_FILE)
        if not os.path.isfile(path):
            raise FileNotFoundError(hint)
        with open(path) as handle:
            return json.load(handle)
    from litdata.streaming.downloader import get_downloader

    with tempfile.TemporaryDirectory() as tmp:
        local = os.path.join(tmp, MANIFEST_FILE)
        try:
            get_downloader(data_dir, tmp, [], storage_options or {}).download_file(
                f"{data_dir.rstrip('/')}/{MANIFEST_FILE}", local)
        except Exception as error:  # each object store raises its own type
            raise FileNotFoundError(f"{hint} ({type(error).__name__}: {error})") from None
        if not os.path.isfile(local):
            raise FileNotFoundError(hint)
        with open(local) as handle:
            return json.load(handle)


def write_manifest(folder: str | os.PathLike, manifest: dict) -> str:
    """Written whole or not at all (a killed prepare leaves no half manifest)."""
    return str(write_json(os.path.join(folder, MANIFEST_FILE), manifest))


def sha256_of(path: str | os.PathLike) -> str:
    """The tokenizer record's ``sha256`` (in manifests and in checkpoints)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


__all__ = ["MANIFEST_FILE", "MANIFEST_FORMAT", "read_manifest", "write_manifest", "sha256_of"]

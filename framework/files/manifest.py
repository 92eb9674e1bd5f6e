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

The paths it names (``splits.*.path``, ``tokenizer.file``) are read relative to its
folder, so they must stay inside it: a manifest naming ``../../data/train`` or ``/etc``
is refused when read, in one line naming the key, before anything opens the path.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import PurePosixPath

from framework.files.atomic_write import write_json
from framework.files.nesting import json_document
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
        with open(path, encoding="utf-8", errors="replace") as handle:
            return checked(handle.read(), path)
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
        with open(local, encoding="utf-8", errors="replace") as handle:
            return checked(handle.read(), f"{data_dir.rstrip('/')}/{MANIFEST_FILE}")


def checked(text: str, where: str) -> dict:
    """A manifest's JSON object, its paths confined to its folder; ``ValueError`` (one line
    naming ``where``) otherwise."""
    try:
        manifest = json_document(text, where)
    except json.JSONDecodeError as error:
        raise ValueError(f"{where} is not valid JSON: {error.msg} (line {error.lineno})") from None
    if not isinstance(manifest, dict):
        raise ValueError(f"{where} is invalid: expected a JSON object, as `layerdrop prepare` writes")
    splits, tokenizer = manifest.get("splits"), manifest.get("tokenizer")
    paths = {f"splits.{name}.path": split.get("path", "")
             for name, split in (splits.items() if isinstance(splits, dict) else []) if isinstance(split, dict)}
    if isinstance(tokenizer, dict) and "file" in tokenizer:
        paths["tokenizer.file"] = tokenizer["file"]
    for key, value in paths.items():
        parts = PurePosixPath(value).parts if isinstance(value, str) else ()
        if not parts or parts[0] == "/" or ".." in parts or "\\" in value or ":" in parts[0]:
            raise ValueError(f"{where}: {key}={value!r} is invalid: a path inside the prepared folder "
                             "(relative, without '..')")
    return manifest


def write_manifest(folder: str | os.PathLike, manifest: dict) -> str:
    """Written whole or not at all (a killed prepare leaves no half manifest)."""
    return str(write_json(os.path.join(folder, MANIFEST_FILE), manifest))


def data_identity(manifest: dict) -> dict:
    """What a run's summary records of a folder it trained on: the tokenizer's sha256 and each
    split's documents and tokens. No path and no command line, so the same data prepared in
    another folder or on another machine compares equal; not a hash of the chunks, which a
    run could not afford to read at every start on a large corpus, but a corpus that differs
    by one document or a tokenizer that differs by one merge changes it."""
    splits = manifest.get("splits") if isinstance(manifest.get("splits"), dict) else {}
    return {"tokenizer_sha256": (manifest.get("tokenizer") or {}).get("sha256"),
            "splits": {name: {"documents": split.get("documents"), "tokens": split.get("tokens")}
                       for name, split in sorted(splits.items()) if isinstance(split, dict)}}


def sha256_of(path: str | os.PathLike) -> str:
    """The tokenizer record's ``sha256`` (in manifests and in checkpoints)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


__all__ = ["MANIFEST_FILE", "MANIFEST_FORMAT", "read_manifest", "checked", "write_manifest", "data_identity",
           "sha256_of"]

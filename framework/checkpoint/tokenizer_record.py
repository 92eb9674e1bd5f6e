"""The tokenizer a model was trained with: how it is recorded, and how it is found
again from any working directory.

The record (one shape everywhere: a prepared folder's manifest, every training
checkpoint under ``checkpoint["layerdrop"]``, an export's config.json)::

    tokenizer   {file: "tokenizer.json", sha256, vocab_size, eos_token, eos_id,
                 bos_token?, bos_id?, document_start?,   (framework/tokenizer.py: the conventions)
                 eos_ids?,   (every id that ends a text: a run from a folder with an eos_token_id list)
                 hf_tokens?} (a run or export from an HF folder: its special tokens as its
                              files say them, framework/checkpoint/hf/tokens.py)
    data_dir    (training checkpoints) the prepared data folder, absolute (or its URL)

``find_tokenizer_of`` looks, in order, in: an exported folder; the checkpoint's own
folder (the copy framework/training/checkpointing/keep_tokenizer.py keeps there); the recorded
absolute data folder; and, for checkpoints written before this record existed, the
data folder as the run named it (relative to the working directory) and the folders
above the checkpoint. A file whose sha256 differs from the recorded one is passed over
(and named in the error)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from framework.checkpoint.base import CKPT_KEY, TOKENIZER_FILE, CheckpointError
from framework.families.family_spec import shown
from framework.files.manifest import read_manifest, sha256_of
from framework.files.staging import is_url
from framework.tokenizer import CONVENTION_KEYS, record_for  # the record's shape is the tokenizer home's

# The token ids a Hugging Face config.json names; each is copied into exports.
TOKEN_ID_KEYS = ("bos_token_id", "eos_token_id", "pad_token_id")


def check_token_ids(config: dict[str, Any], where: str) -> None:
    """A config.json's token ids as Hugging Face writes them: an integer, a list of
    integers, or null. Anything else (``eos_token_id: {"x": 1}``) was copied into every
    export, whose readers then fail; it is a one-line CheckpointError naming the key."""
    def is_id(value: Any) -> bool:
        return isinstance(value, int) and not isinstance(value, bool)

    for key in TOKEN_ID_KEYS:
        value = config.get(key)
        if value is None or is_id(value) or (isinstance(value, list) and value and all(map(is_id, value))):
            continue
        raise CheckpointError(f"{where}: {key}={shown(value)} is invalid: a token id, a non-empty list of token ids, "
                              "or null")


# ------------------------------------------------------------------ finding it again


def record_of(form: Any, metadata: dict[str, Any]) -> dict[str, Any]:
    """The tokenizer record in a checkpoint's metadata (``form`` says where), or {}."""
    entry = metadata.get("tokenizer") if form.self_contained else (metadata.get(CKPT_KEY) or {}).get("tokenizer")
    return dict(entry) if isinstance(entry, dict) else {}


def find_tokenizer_of(path: Path, form: Any, metadata: dict[str, Any]) -> Path:
    """tokenizer.json of the checkpoint at ``path``; CheckpointError (one line, naming
    every place tried) when there is none."""
    record = record_of(form, metadata)
    if form.self_contained:
        candidates = [path / TOKENIZER_FILE]
    else:
        entry = metadata.get(CKPT_KEY) or {}
        folder = path.parent  # the checkpoint folder, also for last.ckpt as a link
        candidates = [folder / TOKENIZER_FILE]
        data_dirs = [entry.get("data_dir"), (metadata.get("datamodule_hyper_parameters") or {}).get("data_dir")]
        for data_dir in data_dirs:
            if isinstance(data_dir, str) and not is_url(data_dir):
                candidates.append(_data_tokenizer(Path(data_dir)))
        candidates += [folder.parent / TOKENIZER_FILE, folder.parent.parent / TOKENIZER_FILE]
    tried = []
    for candidate in dict.fromkeys(candidates):
        if not candidate.is_file():
            tried.append(str(candidate))
        elif record.get("sha256") and sha256_of(candidate) != record["sha256"]:
            tried.append(f"{candidate} (sha256 differs from the checkpoint's)")
        else:
            return candidate.resolve()
    raise CheckpointError(f"no tokenizer found for checkpoint {str(path)!r} (tried {', '.join(tried)})")


def _data_tokenizer(data_dir: Path) -> Path:
    """The tokenizer file a prepared data folder's manifest names."""
    try:
        name = read_manifest(str(data_dir)).get("tokenizer", {}).get("file", TOKENIZER_FILE)
    except (OSError, ValueError, AttributeError):
        name = TOKENIZER_FILE
    return data_dir / name


__all__ = ["CONVENTION_KEYS", "TOKEN_ID_KEYS", "check_token_ids", "record_for", "sha256_of", "record_of",
           "find_tokenizer_of"]

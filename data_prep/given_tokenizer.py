"""``prepare --tokenizer PATH``: a tokenizer made elsewhere, and its conventions.

PATH is one of:

* a ``tokenizer.json`` file: its EOS is ``--eos-token`` or the first usual EOS name it
  holds (framework/tokenizer.py);
* a prepared folder (``manifest.json`` beside its ``tokenizer.json``): the folder's
  tokenizer with the EOS and document start its manifest records, so a second source
  of a mixture is prepared exactly as the first (the mixture loader refuses sources
  whose tokenizer hash or convention differ);
* a Hugging Face model folder (``tokenizer.json`` without a manifest): its EOS is the
  ``eos_token`` of ``tokenizer_config.json`` (else ``special_tokens_map.json``, else the
  first ``eos_token_id`` of config.json / generation_config.json).

In every case the document start is ``--document-start``, else the recorded one, else
"bos" for a tokenizer whose post-processor adds a BOS (as Hugging Face's ``tok(text)``
starts a text) and "eos" otherwise. The tokenizer.json is copied verbatim into the
prepared folder, so its sha256 is the given file's. Only JSON is read (no
``transformers`` loading, no pickles, no code from the folder).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer

from data_prep.errors import PrepareError
from framework.files.manifest import MANIFEST_FILE, read_manifest, sha256_of
from framework.tokenizer import default_document_start, find_bos, find_eos, folder_token_ids, load_tokenizer

TOKENIZER_FILE = "tokenizer.json"
# Hugging Face folder files that name the special tokens, in the order they are asked
SPECIAL_TOKEN_FILES = ("tokenizer_config.json", "special_tokens_map.json")


@dataclass
class GivenTokenizer:
    tokenizer: Tokenizer
    path: str  # the tokenizer.json to copy into the prepared folder
    eos_token: str
    eos_id: int
    document_start: str  # "bos" | "eos"
    origin: str  # what --tokenizer named, absolute


def load_given_tokenizer(value: str, eos_token: str | None = None,
                         document_start: str | None = None) -> GivenTokenizer:
    """The tokenizer ``--tokenizer value`` names, with its EOS and document start
    (``eos_token`` / ``document_start``: the flags, which win); PrepareError or
    TokenizerError (one line) otherwise."""
    flag = f"--tokenizer {value!r}"
    recorded: dict = {}
    if os.path.isdir(value):
        path = os.path.join(value, TOKENIZER_FILE)
        if os.path.isfile(os.path.join(value, MANIFEST_FILE)):
            recorded, path = _prepared_folder(value, flag)
        elif not os.path.isfile(path):
            raise PrepareError(f"{flag}: the folder holds no {TOKENIZER_FILE} (give a prepared folder, a Hugging "
                               f"Face model folder or a {TOKENIZER_FILE}; a folder with only a SentencePiece "
                               f"tokenizer.model: write its {TOKENIZER_FILE} once with transformers' save_pretrained)")
    elif os.path.isfile(value):
        path = value
    else:
        raise PrepareError(f"{flag}: no such file or folder (give 'train', a {TOKENIZER_FILE}, a prepared folder "
                           "or a Hugging Face model folder)")
    tokenizer = load_tokenizer(path)
    eos_flag = "--eos-token"
    if eos_token is None and recorded.get("eos_token"):
        eos_token, eos_flag = recorded["eos_token"], f"the eos_token of its {MANIFEST_FILE}"
    elif eos_token is None and os.path.isdir(value):
        eos_token, eos_flag = _hf_eos(Path(value), tokenizer)
    eos_token, eos_id = find_eos(tokenizer, eos_token, flag=eos_flag, where=path)
    start = document_start or recorded.get("document_start") or default_document_start(tokenizer)
    if start == "bos" and find_bos(tokenizer) is None:
        raise PrepareError(f"--document-start bos: {value} adds no BOS to a text (allowed: eos)")
    return GivenTokenizer(tokenizer, path, eos_token, eos_id, start, os.path.abspath(value))


def _prepared_folder(folder: str, flag: str) -> tuple[dict, str]:
    """(the manifest's tokenizer record, the file it names), checked against each other."""
    try:
        entry = read_manifest(folder).get("tokenizer")
    except (OSError, ValueError) as error:
        raise PrepareError(f"{flag}: its {MANIFEST_FILE} is not readable ({error})") from None
    if not isinstance(entry, dict):
        raise PrepareError(f"{flag}: its {MANIFEST_FILE} records no tokenizer")
    path = os.path.join(folder, str(entry.get("file") or TOKENIZER_FILE))
    if not os.path.isfile(path):
        raise PrepareError(f"{flag}: {path} is missing (its {MANIFEST_FILE} names it)")
    if entry.get("sha256") and sha256_of(path) != entry["sha256"]:
        raise PrepareError(f"{flag}: {path} is not the tokenizer its {MANIFEST_FILE} records (sha256 differs): "
                           "the folder was changed after it was prepared")
    # A folder prepared before the key existed separated documents by EOS only.
    return {"eos_token": entry.get("eos_token"), "document_start": entry.get("document_start") or "eos"}, path


def _hf_eos(folder: Path, tokenizer: Tokenizer) -> tuple[str | None, str]:
    """(the EOS a Hugging Face folder names, where it names it): tokenizer_config.json,
    special_tokens_map.json, then config.json's / generation_config.json's first eos_token_id."""
    for name in SPECIAL_TOKEN_FILES:
        value = _json_object(folder / name).get("eos_token")
        if isinstance(value, dict):  # {"content": "</s>", "__type": "AddedToken", ...}
            value = value.get("content")
        if isinstance(value, str) and value:
            return value, f"the eos_token of {name}"
    ids = folder_token_ids(folder, _json_object(folder / "config.json"), "eos_token_id")
    token = next((tokenizer.id_to_token(i) for i in ids if tokenizer.id_to_token(i) is not None), None)
    return token, "the eos_token_id of config.json"


def _json_object(path: Path) -> dict:
    """The JSON object in ``path``; {} when it is missing or not one (the next file is asked)."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return {}
    return value if isinstance(value, dict) else {}

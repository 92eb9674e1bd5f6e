"""The special tokens of a Hugging Face folder, as its three files say them, carried
whole into every export made from it (directly, or after continued pretraining).

A folder says its tokens in three places, and they differ on purpose (Qwen2.5-Instruct:
config.json ``eos_token_id`` 151645 ``<|im_end|>``; generation_config.json
``eos_token_id`` [151645, 151643] and ``pad_token_id`` 151643; tokenizer_config.json
``bos_token`` null and ``pad_token`` ``<|endoftext|>``). Rebuilding them from one EOS
and one BOS dropped the list that stops chat turns, the pad that ``tok(texts,
padding=True)`` needs, and invented a BOS. So the record keeps each file's own values::

    hf_tokens  {config: {bos_token_id?, eos_token_id?, pad_token_id?},
                generation_config?: {the same keys},          (absent: the folder had none)
                tokenizer_config?: {bos_token?, eos_token?, pad_token?, unk_token?,
                                    chat_template?, add_bos_token?, add_eos_token?, ...},
                tokenizer_sha256?}                             (the tokenizer.json they name)

It travels in the tokenizer record (framework/checkpoint/tokenizer_record.py), so a run
from ``model.init_from`` keeps it in every checkpoint and export. Only values of the
right type are kept (an id or list of ids, a token string, a string template, a flag):
the files may come from anyone and nothing here is evaluated.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from framework.checkpoint.base import TOKENIZER_FILE
from framework.checkpoint.tokenizer_record import TOKEN_ID_KEYS, check_token_ids
from framework.files.manifest import sha256_of
from framework.files.nesting import json_document

GENERATION_CONFIG_FILE = "generation_config.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
TOKEN_KEYS = ("bos_token", "eos_token", "pad_token", "unk_token")
# tokenizer_config.json entries that change what the tokenizer makes of a text, beside its tokens
FLAG_KEYS = ("add_bos_token", "add_eos_token", "clean_up_tokenization_spaces")
TEXT_KEYS = ("chat_template", "padding_side")


def read_hf_tokens(folder: Path, config: dict[str, Any]) -> dict[str, Any]:
    """The ``hf_tokens`` record of the HF folder ``folder`` whose config.json is ``config``."""
    record: dict[str, Any] = {"config": {key: config[key] for key in TOKEN_ID_KEYS if key in config}}
    generation = _json_file(folder / GENERATION_CONFIG_FILE)
    if generation is not None:
        check_token_ids(generation, str(folder / GENERATION_CONFIG_FILE))
        record["generation_config"] = {key: generation[key] for key in TOKEN_ID_KEYS if key in generation}
    tokenizer_config = _json_file(folder / TOKENIZER_CONFIG_FILE)
    if tokenizer_config is not None:
        record["tokenizer_config"] = _tokenizer_entries(tokenizer_config)
    if (folder / TOKENIZER_FILE).is_file():
        record["tokenizer_sha256"] = sha256_of(folder / TOKENIZER_FILE)
    return record


def hf_tokens_of(ckpt: Any) -> dict[str, Any] | None:
    """The ``hf_tokens`` of an opened checkpoint: an HF folder's own, else the one its
    tokenizer record carries (a run or export that started from an HF folder), else None."""
    if ckpt.form.name == "hf":
        return read_hf_tokens(ckpt.path, ckpt.metadata)
    carried = ckpt.tokenizer_record().get("hf_tokens")
    return dict(carried) if isinstance(carried, dict) else None


def generation_ids(record: dict[str, Any]) -> dict[str, Any]:
    """generation_config.json's token ids: the folder's own, and its config.json's where
    the folder's generation_config.json has none (or no such file)."""
    own = {key: value for key, value in record.get("generation_config", {}).items() if value is not None}
    return {**record["config"], **own}


def tokenizer_entries(record: dict[str, Any], tokenizer: Path | None) -> dict[str, Any] | None:
    """tokenizer_config.json's carried entries when ``tokenizer`` is the file they were
    written for (a --tokenizer of another vocabulary gets none: its tokens may differ)."""
    entries = record.get("tokenizer_config")
    if entries is None or tokenizer is None:
        return None
    if record.get("tokenizer_sha256") not in (None, sha256_of(tokenizer)):
        return None
    return dict(entries)


def _tokenizer_entries(config: dict[str, Any]) -> dict[str, Any]:
    entries: dict[str, Any] = {}
    for key in TOKEN_KEYS:
        if key in config:
            token = _token_text(config[key])
            if token is not None or config[key] is None:
                entries[key] = token
    entries.update({key: config[key] for key in FLAG_KEYS if isinstance(config.get(key), bool)})
    entries.update({key: config[key] for key in TEXT_KEYS if isinstance(config.get(key), str)})
    return entries


def _token_text(value: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: a string, or an AddedToken's dict."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _json_file(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    try:
        document = json_document(path.read_text(), str(path))
    except (OSError, ValueError):
        return None  # unreadable metadata beside the weights: nothing to carry
    return document if isinstance(document, dict) else None


__all__ = ["read_hf_tokens", "hf_tokens_of", "generation_ids", "tokenizer_entries", "GENERATION_CONFIG_FILE",
           "TOKENIZER_CONFIG_FILE"]

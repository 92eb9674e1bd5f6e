"""The tokenizer, in one place: loading a tokenizer.json, its end-of-text (EOS) and
begin-of-text (BOS) ids, how a document starts, and text <-> token ids as the model
saw them in training.

Two document-start conventions (``document_start`` in a prepared folder's manifest
and in every checkpoint's tokenizer record):

    "eos"  documents are separated by EOS only, so a text starts after an EOS (the
           BPE that `layerdrop prepare` trains has no BOS; every folder prepared
           before the key existed)
    "bos"  each document is what the tokenizer's own post-processor makes of it (BOS
           first, as Hugging Face's ``tok(text)``), then EOS

A prompt is encoded the same way: ``[EOS] + ids`` under "eos"; the post-processor's
output otherwise, so a Llama-3 folder is conditioned on ``<|begin_of_text|>`` exactly
as ``model.generate(**tok(text))`` is. A Hugging Face folder records no convention: its
tokenizer's post-processor is the convention.

Generation stops at any id of ``TextCodec.stop_ids``: the EOS and, for a folder whose
config.json / generation_config.json name an ``eos_token_id`` list (Llama-3.x-Instruct:
``<|end_of_text|>``, ``<|eom_id|>``, ``<|eot_id|>``), every id of it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Protocol

from tokenizers import Tokenizer

from framework.files.manifest import MANIFEST_FILE, read_manifest, sha256_of
from framework.files.nesting import json_document



class OpenedCheckpoint(Protocol):
    """What this module reads of a ``framework.checkpoint.Checkpoint`` (it is handed one, never
    imports the package: checkpoints read tokenizers through this module, not the other way round)."""

    path: Path
    form: Any
    metadata: dict[str, Any]
    model_config: Any
    tokenizer_record: dict[str, Any] | None

    def find_tokenizer(self) -> Path: ...

TOKENIZER_FILE = "tokenizer.json"

# The usual end-of-text names, in the order a tokenizer without a recorded EOS is
# searched for one (GPT-2/our BPE, Llama 3, SentencePiece models, Gemma, ...).
EOS_CANDIDATES = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "<|eos|>", "<|im_end|>", "<|eot_id|>")
DOCUMENT_STARTS = ("bos", "eos")
GENERATION_CONFIG_FILE = "generation_config.json"


class TokenizerError(ValueError):
    """A tokenizer that is missing, unreadable, or lacks a token asked of it (one line)."""


# What a record may say of the tokens beyond the file, copied wherever a record travels
# (framework/checkpoint/tokenizer_record.py: where records live and how a checkpoint's is found).
CONVENTION_KEYS = ("bos_token", "bos_id", "document_start", "eos_ids")


def record_for(*, sha256: str | None, vocab_size: Any, eos_token: Any, eos_id: Any, name: str = TOKENIZER_FILE,
               **conventions: Any) -> dict[str, Any]:
    """The record of a tokenizer stored under the file name ``name``; the BOS and the
    document-start convention (CONVENTION_KEYS) only where known: older records lack them."""
    unknown = sorted(set(conventions) - set(CONVENTION_KEYS))
    if unknown:
        raise TypeError(f"record_for: {unknown[0]!r} is not a tokenizer record key")
    return {"file": name, "sha256": sha256, "vocab_size": vocab_size, "eos_token": eos_token, "eos_id": eos_id,
            **{key: value for key, value in conventions.items() if value is not None}}


def load_tokenizer(path: str | os.PathLike, flag: str = "--tokenizer") -> Tokenizer:
    """The tokenizer.json at ``path``; TokenizerError naming ``flag`` and the file otherwise."""
    if not os.path.isfile(path):
        raise TokenizerError(f"{flag} {str(path)!r}: no such file (give a tokenizer.json)")
    try:
        return Tokenizer.from_file(str(path))
    except Exception as error:  # the Rust side raises plain Exception with a parse message
        message = (str(error).splitlines() or [type(error).__name__])[0]
        raise TokenizerError(f"{flag} {str(path)!r}: not a readable tokenizer.json ({message})") from None


def special_tokens(tokenizer: Tokenizer, **ids: int | list[int] | None) -> dict[str, str]:
    """{key: the token of its id} for each ``key=id`` (an id list: its first) the vocabulary
    holds, e.g. ``special_tokens(tok, eos_token=eos_id)`` for transformers' tokenizer_config.json."""
    tokens = {}
    for key, token_id in ids.items():
        token_id = (token_id or [None])[0] if isinstance(token_id, list) else token_id
        token = tokenizer.id_to_token(token_id) if isinstance(token_id, int) else None
        if token is not None:
            tokens[key] = token
    return tokens


def vocab_size_of(tokenizer: Tokenizer) -> int:
    """Rows an embedding needs: one more than the largest id, added tokens included."""
    return max(tokenizer.get_vocab(with_added_tokens=True).values()) + 1


def find_eos(tokenizer: Tokenizer, requested: str | None = None, *, flag: str = "--eos-token",
             where: str = "the tokenizer") -> tuple[str, int]:
    """(EOS token, its id): ``requested``, else the first of EOS_CANDIDATES the vocabulary holds."""
    if requested is not None:
        token_id = tokenizer.token_to_id(requested)
        if token_id is None:
            raise TokenizerError(f"{flag} {requested!r} is not in the vocabulary of {where}")
        return requested, token_id
    for name in EOS_CANDIDATES:
        token_id = tokenizer.token_to_id(name)
        if token_id is not None:
            return name, token_id
    raise TokenizerError(f"{where} has none of the usual EOS tokens ({', '.join(EOS_CANDIDATES)}); "
                         f"name yours with {flag}")


def added_prefix(tokenizer: Tokenizer) -> list[int]:
    """The ids the tokenizer's post-processor puts before a text (Llama 3: [BOS]; ours: [])."""
    plain = tokenizer.encode("a", add_special_tokens=False).ids
    full = tokenizer.encode("a", add_special_tokens=True).ids
    for start in range(len(full) - len(plain) + 1):
        if full[start:start + len(plain)] == plain:
            return full[:start]
    return []


def find_bos(tokenizer: Tokenizer) -> tuple[str, int] | None:
    """(BOS token, its id) when the post-processor starts every text with one token."""
    prefix = added_prefix(tokenizer)
    if len(prefix) != 1:
        return None
    return tokenizer.id_to_token(prefix[0]), prefix[0]


def default_document_start(tokenizer: Tokenizer) -> str:
    """"bos" for a tokenizer that adds a BOS (as Hugging Face's would), "eos" otherwise."""
    return "bos" if find_bos(tokenizer) is not None else "eos"


def id_list(value: Any) -> list[int]:
    """An ``eos_token_id`` as Hugging Face writes it (an int, a list of ints, or null) as a list."""
    values = value if isinstance(value, list) else [value]
    return [v for v in values if isinstance(v, int) and not isinstance(v, bool)]


def folder_token_ids(folder: Path, config: dict[str, Any], key: str) -> list[int]:
    """``key`` (eos_token_id / bos_token_id) of a folder's config.json (``config``) and its
    generation_config.json, which Hugging Face's ``generate`` reads: every id, in order."""
    ids = id_list(config.get(key))
    generation = folder / GENERATION_CONFIG_FILE
    if generation.is_file():
        try:
            ids += id_list(json_document(generation.read_text(), str(generation)).get(key))
        except (OSError, ValueError, AttributeError):
            pass  # a broken generation_config.json changes no token of the model
    return list(dict.fromkeys(ids))


def opened(ckpt: Any) -> OpenedCheckpoint:
    """``ckpt`` when it is an opened checkpoint (this module reads checkpoints it is
    handed, it opens none: the checkpoint package sits above the tokenizer)."""
    if not hasattr(ckpt, "find_tokenizer"):
        raise TypeError(f"{ckpt!r} is not an opened checkpoint: pass framework.checkpoint.Checkpoint.open(path)")
    return ckpt


def check_model_tokenizer(ckpt: OpenedCheckpoint, data_file: str, data_record: dict[str, Any],
                          *, flag: str = "model.init_from") -> None:
    """Refuse data whose tokenizer is not the model's (an opened checkpoint), in one line
    naming both: the same file (sha256), else the same vocabulary. A model without a
    tokenizer file needs the data's vocabulary to be its embedding's size."""
    ckpt = opened(ckpt)
    model_name = f"{flag}={str(ckpt.path)!r}"
    try:
        model_file: Path | None = ckpt.find_tokenizer()
    except ValueError:  # none found (CheckpointError)
        model_file = None
    if model_file is None:
        rows = ckpt.model_config.vocab_size
        if data_record.get("vocab_size") != rows:
            raise TokenizerError(f"the data's tokenizer {data_file} has a vocabulary of {data_record.get('vocab_size')}, "
                                 f"{model_name} has {rows} embedding rows and no tokenizer.json: prepare the data "
                                 "with the model's tokenizer (layerdrop prepare --tokenizer FILE)")
        return
    if data_record.get("sha256") and data_record["sha256"] == sha256_of(model_file):
        return
    same = False
    if os.path.isfile(data_file):  # a file can differ in bytes and hold the same vocabulary
        same = (load_tokenizer(data_file, "the data's tokenizer").get_vocab(with_added_tokens=True)
                == load_tokenizer(model_file, "the model's tokenizer").get_vocab(with_added_tokens=True))
    if not same:
        raise TokenizerError(f"the data's tokenizer {data_file} is not the tokenizer of {model_name} ({model_file}): "
                             f"its token ids would mean other strings; prepare the data with "
                             f"--tokenizer {model_file}")


def model_stop_ids(ckpt: OpenedCheckpoint, eos_id: int | None) -> list[int]:
    """``eos_id`` and every id an opened checkpoint says ends a text (a folder's
    ``eos_token_id`` list, or its record's ``eos_ids``), in that order."""
    ckpt = opened(ckpt)
    ids = folder_token_ids(ckpt.path, ckpt.metadata, "eos_token_id") if ckpt.form.self_contained else []
    ids += id_list(ckpt.tokenizer_record().get("eos_ids"))
    return list(dict.fromkeys(([eos_id] if isinstance(eos_id, int) else []) + ids))


@dataclass
class TextCodec:
    """A tokenizer and its conventions: text -> ids -> text, as the model saw them."""

    tokenizer: Tokenizer
    eos_id: int
    path: Path
    eos_first: bool = True  # the "eos" convention: a text starts after an EOS
    stop_ids: tuple[int, ...] = field(default=())

    def __post_init__(self) -> None:
        self.stop_ids = tuple(dict.fromkeys((self.eos_id, *self.stop_ids)))

    @classmethod
    def for_checkpoint(cls, ckpt: OpenedCheckpoint, tokenizer: str | os.PathLike | None = None,
                       eos_token: str | None = None) -> "TextCodec":
        """The codec of an opened checkpoint of any form (``Checkpoint.open(path)``): its
        tokenizer, or ``tokenizer``. The EOS is ``eos_token``, else the recorded one (checkpoint, else
        the manifest beside the tokenizer), else the folder config's first
        ``eos_token_id``, else the first usual EOS name in the vocabulary."""
        ckpt = opened(ckpt)
        path = Path(tokenizer) if tokenizer is not None else ckpt.find_tokenizer()
        loaded = load_tokenizer(path, "tokenizer")
        record = {} if tokenizer is not None else recorded_conventions(ckpt, path)
        config_eos = folder_token_ids(ckpt.path, ckpt.metadata, "eos_token_id") if ckpt.form.self_contained else []
        config_eos = [i for i in config_eos if loaded.id_to_token(i) is not None]
        if eos_token is not None:
            eos_id, stops = find_eos(loaded, eos_token, flag="eot_token", where=str(path))[1], []
        else:
            eos_id = record.get("eos_id")
            if not isinstance(eos_id, int):
                eos_id = config_eos[0] if config_eos else find_eos(loaded, flag="eot_token", where=str(path))[1]
            stops = config_eos + [i for i in id_list(record.get("eos_ids")) if loaded.id_to_token(i) is not None]
        start = record.get("document_start")
        if start is None:  # no record: a tokenizer with a BOS (or an HF folder) is its own convention
            start = "bos" if find_bos(loaded) is not None or ckpt.form.name == "hf" else "eos"
        return cls(loaded, eos_id, path, eos_first=start == "eos", stop_ids=tuple(stops))

    @property
    def start_id(self) -> int:
        """The id a document starts after (EOS) or with (BOS): what stands before a text
        with no context (lm-eval's prefix token, as its Hugging Face backend picks it)."""
        bos = None if self.eos_first else find_bos(self.tokenizer)
        return self.eos_id if bos is None else bos[1]

    def encode(self, text: str) -> list[int]:
        """The text's own ids, nothing added."""
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Iterable[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)

    def encode_prompt(self, text: str) -> list[int]:
        """A prompt starts a new document, as documents started in training."""
        if self.eos_first:
            return [self.eos_id] + self.encode(text)
        return self.tokenizer.encode(text, add_special_tokens=True).ids


class CodecLoader:
    """Loads an opened checkpoint's ``TextCodec`` on first use (prompts that are token ids need none)."""

    def __init__(self, ckpt: OpenedCheckpoint, tokenizer: str | os.PathLike | None = None,
                 eos_token: str | None = None) -> None:
        self.ckpt, self.tokenizer, self.eos_token = ckpt, tokenizer, eos_token
        self.loaded: TextCodec | None = None

    def __call__(self) -> TextCodec:
        if self.loaded is None:
            self.loaded = TextCodec.for_checkpoint(self.ckpt, self.tokenizer, self.eos_token)
        return self.loaded

    def stop_ids_or_none(self) -> tuple[int, ...] | None:
        """The ids that end a text when a tokenizer can be found (given one, it must load)."""
        try:
            return self().stop_ids
        except TokenizerError:
            raise
        except ValueError:  # no tokenizer found (CheckpointError)
            if self.tokenizer is not None:
                raise
            return None


def recorded_conventions(ckpt: OpenedCheckpoint, path: Path) -> dict[str, Any]:
    """The checkpoint's tokenizer record, completed by the manifest of the prepared
    folder its tokenizer was found in (records older than a key lack it)."""
    record = ckpt.tokenizer_record()
    manifest = path.parent / MANIFEST_FILE
    if manifest.is_file() and ("eos_id" not in record or "document_start" not in record):
        try:
            entry = read_manifest(str(path.parent)).get("tokenizer", {})
        except (OSError, ValueError):
            entry = {}
        if isinstance(entry, dict):
            record = {**entry, **{k: v for k, v in record.items() if v is not None}}
    return record


__all__ = ["EOS_CANDIDATES", "DOCUMENT_STARTS", "TOKENIZER_FILE", "CONVENTION_KEYS", "TokenizerError", "load_tokenizer",
           "special_tokens", "vocab_size_of", "find_eos", "added_prefix", "find_bos", "default_document_start",
           "record_for", "id_list", "folder_token_ids", "opened",
           "check_model_tokenizer", "model_stop_ids", "TextCodec", "CodecLoader", "recorded_conventions"]

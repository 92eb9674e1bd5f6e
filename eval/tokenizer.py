"""The tokenizer of a checkpoint: where it is found, its EOS, text <-> token ids.

``find_tokenizer`` is the one place eval code looks for a checkpoint's tokenizer
(``framework.checkpoint.find_tokenizer`` replaces its body once checkpoints carry
their tokenizer). It is light on purpose: `layerdrop generate` must not import lm-eval.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Tokenizer

TOKENIZER_FILE = "tokenizer.json"
EOS_CANDIDATES = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "<|eos|>", "<|im_end|>", "<|eot_id|>")


def training_data_dir(ckpt: Path) -> Path | None:
    """The data folder a Lightning checkpoint's run trained on (its datamodule's
    hyperparameters), read without materialising the weights."""
    if ckpt.is_dir() or not ckpt.is_file():
        return None
    try:
        saved = torch.load(ckpt, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # not a readable checkpoint: load_decoder reports why
        return None
    data_dir = (saved.get("datamodule_hyper_parameters") or {}).get("data_dir") if isinstance(saved, dict) else None
    return Path(data_dir) if isinstance(data_dir, str) else None


def find_tokenizer(ckpt: str | Path) -> tuple[Path, int | None]:
    """(tokenizer.json, EOS id from the data manifest or None) for a checkpoint.

    Looked for, in order: inside an exported folder; beside the .ckpt and one and two
    folders up (runs/x/checkpoints/last.ckpt -> runs/x); the data folder of the run
    (its manifest names the tokenizer file and the EOS id).
    """
    ckpt = Path(ckpt)
    folder = ckpt if ckpt.is_dir() else ckpt.parent
    candidates = [folder / TOKENIZER_FILE, folder.parent / TOKENIZER_FILE, folder.parent.parent / TOKENIZER_FILE]
    for path in candidates:
        if path.is_file():
            return path, None
    data_dir = training_data_dir(ckpt)
    if data_dir is not None and (data_dir / "manifest.json").is_file():
        tokenizer = json.loads((data_dir / "manifest.json").read_text()).get("tokenizer", {})
        path = data_dir / tokenizer.get("file", TOKENIZER_FILE)
        if path.is_file():
            return path, tokenizer.get("eos_id")
        candidates.append(path)
    elif data_dir is not None:
        candidates.append(data_dir / TOKENIZER_FILE)
    tried = ", ".join(str(p) for p in candidates)
    raise ValueError(f"no tokenizer found for checkpoint {str(ckpt)!r} (tried {tried}); pass its tokenizer.json")


def eos_id_of(tokenizer: Tokenizer, requested: str | None) -> int:
    if requested is not None:
        token_id = tokenizer.token_to_id(requested)
        if token_id is None:
            raise ValueError(f"eot_token={requested!r} is not in the tokenizer's vocabulary")
        return token_id
    for name in EOS_CANDIDATES:
        token_id = tokenizer.token_to_id(name)
        if token_id is not None:
            return token_id
    raise ValueError(f"the tokenizer has none of the usual end-of-text tokens ({', '.join(EOS_CANDIDATES)}); "
                     "name yours with eot_token=")


@dataclass
class TextCodec:
    """A tokenizer and its end-of-text id: text -> ids -> text, as the model saw them."""

    tokenizer: Tokenizer
    eos_id: int
    path: Path

    @classmethod
    def for_checkpoint(cls, ckpt: str | Path, tokenizer: str | Path | None = None,
                       eos_token: str | None = None) -> "TextCodec":
        """The checkpoint's tokenizer (or ``tokenizer``); the EOS is ``eos_token``, else the
        data manifest's, else the first usual EOS name in the vocabulary."""
        if tokenizer is not None:
            path, manifest_eos = Path(tokenizer), None
            if not path.is_file():
                raise ValueError(f"tokenizer {str(path)!r} does not exist")
        else:
            path, manifest_eos = find_tokenizer(ckpt)
        loaded = Tokenizer.from_file(str(path))
        eos = manifest_eos if manifest_eos is not None and eos_token is None else eos_id_of(loaded, eos_token)
        return cls(loaded, eos, path)

    def encode(self, text: str) -> list[int]:
        # Our tokenizers add nothing; documents in training were separated by EOS only.
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def encode_prompt(self, text: str) -> list[int]:
        """A prompt starts a new document: EOS first, as between training documents."""
        return [self.eos_id] + self.encode(text)


class CodecLoader:
    """Loads a checkpoint's ``TextCodec`` on first use (prompts that are token ids need none)."""

    def __init__(self, ckpt: str | Path, tokenizer: str | Path | None = None, eos_token: str | None = None) -> None:
        self.ckpt, self.tokenizer, self.eos_token = ckpt, tokenizer, eos_token
        self.loaded: TextCodec | None = None

    def __call__(self) -> TextCodec:
        if self.loaded is None:
            self.loaded = TextCodec.for_checkpoint(self.ckpt, self.tokenizer, self.eos_token)
        return self.loaded

    def eos_id_or_none(self) -> int | None:
        """The EOS id when a tokenizer can be found (given one, it must load)."""
        try:
            return self().eos_id
        except ValueError:
            if self.tokenizer is not None:
                raise
            return None


__all__ = ["TOKENIZER_FILE", "EOS_CANDIDATES", "training_data_dir", "find_tokenizer", "eos_id_of", "TextCodec",
           "CodecLoader"]

"""The tokenizer of a checkpoint: where it is found, its EOS, text <-> token ids.

``find_tokenizer`` is the one place eval code looks for a checkpoint's tokenizer; it
asks ``framework.checkpoint.find_tokenizer``, which knows every checkpoint form. It is
light on purpose: `layerdrop generate` must not import lm-eval.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer

from framework.checkpoint import TOKENIZER_FILE, Checkpoint, tokenizer_record
from framework.checkpoint import find_tokenizer as find_checkpoint_tokenizer
from framework.checkpoint.tokenizer_record import EOS_CANDIDATES, first_eos


def find_tokenizer(ckpt: str | Path | Checkpoint) -> tuple[Path, int | None]:
    """(tokenizer.json, the EOS id recorded with it, or None) for a checkpoint of any
    form (a path, or a Checkpoint already opened), from any working directory. Where
    to look is ``framework.checkpoint``'s business; the EOS id comes from the
    checkpoint's tokenizer record, else from the manifest of the prepared data folder
    the tokenizer was found in."""
    path = find_checkpoint_tokenizer(ckpt)
    eos_id = tokenizer_record(ckpt).get("eos_id")
    manifest = path.parent / "manifest.json"
    if eos_id is None and manifest.is_file():
        eos_id = json.loads(manifest.read_text()).get("tokenizer", {}).get("eos_id")
    return path, eos_id


class TokenizerFileError(ValueError):
    """A tokenizer.json that is there but does not load (never silently skipped)."""


def load_tokenizer(path: str | Path) -> Tokenizer:
    try:
        return Tokenizer.from_file(str(path))
    except Exception as err:  # tokenizers raises a bare Exception for any file it cannot read
        reason = (str(err).splitlines() or ["unreadable"])[0]
        raise TokenizerFileError(f"tokenizer {str(path)!r} is not a valid tokenizer.json: {reason}") from None


def eos_id_of(tokenizer: Tokenizer, requested: str | None) -> int:
    if requested is not None:
        token_id = tokenizer.token_to_id(requested)
        if token_id is None:
            raise ValueError(f"eot_token={requested!r} is not in the tokenizer's vocabulary")
        return token_id
    found = first_eos(tokenizer)
    if found is not None:
        return found[1]
    raise ValueError(f"the tokenizer has none of the usual end-of-text tokens ({', '.join(EOS_CANDIDATES)}); "
                     "name yours with eot_token=")


@dataclass
class TextCodec:
    """A tokenizer and its end-of-text id: text -> ids -> text, as the model saw them."""

    tokenizer: Tokenizer
    eos_id: int
    path: Path

    @classmethod
    def for_checkpoint(cls, ckpt: str | Path | Checkpoint, tokenizer: str | Path | None = None,
                       eos_token: str | None = None) -> "TextCodec":
        """The checkpoint's tokenizer (or ``tokenizer``); the EOS is ``eos_token``, else the
        data manifest's, else the first usual EOS name in the vocabulary."""
        if tokenizer is not None:
            path, manifest_eos = Path(tokenizer), None
            if not path.is_file():
                raise ValueError(f"tokenizer {str(path)!r} does not exist")
        else:
            path, manifest_eos = find_tokenizer(ckpt)
        loaded = load_tokenizer(path)
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
        except TokenizerFileError:
            raise
        except ValueError:
            if self.tokenizer is not None:
                raise
            return None


__all__ = ["TOKENIZER_FILE", "EOS_CANDIDATES", "TokenizerFileError", "find_tokenizer", "load_tokenizer", "eos_id_of",
           "TextCodec", "CodecLoader"]

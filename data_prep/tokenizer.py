"""The tokenizer: a byte-level BPE trained on the corpus, or a user's tokenizer.json.

Byte-level BPE (GPT-2 style pre-tokenization over the 256 byte symbols) never needs
an unknown token and decodes every document back to its exact text. Documents are
separated by one EOS token, which is the first special token (id 0) of a trained
tokenizer. A loaded tokenizer must define an EOS: ``--eos-token`` names it, otherwise
the first of ``EOS_CANDIDATES`` that the vocabulary holds is used.
"""

from __future__ import annotations

import os
from typing import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from data_prep.errors import PrepareError
from framework.checkpoint.tokenizer_record import EOS_CANDIDATES, first_eos

DEFAULT_EOS = EOS_CANDIDATES[0]
BYTE_ALPHABET_SIZE = 256


def train_tokenizer(texts: Iterable[str], vocab_size: int, eos_token: str = DEFAULT_EOS,
                    progress: bool = False) -> Tokenizer:
    """A byte-level BPE with ``vocab_size`` entries (EOS + 256 bytes + merges)."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,  # a merge seen once is noise, not vocabulary
        special_tokens=[eos_token],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=progress,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return tokenizer


def load_tokenizer(path: str) -> Tokenizer:
    if not os.path.isfile(path):
        raise PrepareError(f"--tokenizer {path!r}: no such file (give a tokenizer.json or 'train')")
    try:
        return Tokenizer.from_file(path)
    except Exception as error:  # the Rust side raises plain Exception with a parse message
        message = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise PrepareError(f"--tokenizer {path!r}: not a readable tokenizer.json ({message})") from None


def vocab_size_of(tokenizer: Tokenizer) -> int:
    """Rows an embedding needs: one more than the largest id, added tokens included."""
    return max(tokenizer.get_vocab(with_added_tokens=True).values()) + 1


def find_eos(tokenizer: Tokenizer, requested: str | None, path: str) -> tuple[str, int]:
    """(EOS token, its id) of a loaded tokenizer."""
    if requested is not None:
        token_id = tokenizer.token_to_id(requested)
        if token_id is None:
            raise PrepareError(f"--eos-token {requested!r} is not in the vocabulary of {path}")
        return requested, token_id
    found = first_eos(tokenizer)
    if found is not None:
        return found
    raise PrepareError(f"{path} has none of the usual EOS tokens ({', '.join(EOS_CANDIDATES)}); "
                       "name yours with --eos-token")

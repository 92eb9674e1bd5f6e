"""The trained tokenizer: a byte-level BPE learnt from the corpus (`--tokenizer train`).

Byte-level BPE (GPT-2 style pre-tokenization over the 256 byte symbols) never needs
an unknown token and decodes every document back to its exact text. Documents are
separated by one EOS token, which is the first special token (id 0); it has no BOS
(the "eos" document start of framework/tokenizer.py, which loads any tokenizer.json
and finds its EOS and BOS).
"""

from __future__ import annotations

from typing import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from framework.tokenizer import EOS_CANDIDATES

DEFAULT_EOS = EOS_CANDIDATES[0]


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

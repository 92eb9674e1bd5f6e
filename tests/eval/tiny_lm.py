"""A tiny decoder and byte-level BPE tokenizer for the lm-eval and downstream tests.

The tokenizer is trained on the fixture texts (vocab 300: EOS, the 256 byte symbols
and ~40 merges), the model is random (d=32, L=3) and exported like `layerdrop export`
does, with the tokenizer beside it where ``find_tokenizer`` looks first.
"""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from framework.checkpoint import export_decoder
from tests.helpers.tiny_decoder import tiny_decoder  # noqa: F401  (re-exported: the eval tests import it from here)

FIXTURES = Path(__file__).parent / "fixtures"
TASKS = FIXTURES / "lm_eval_tasks"
EOS = "<|endoftext|>"


def fixture_texts() -> list[str]:
    return [line for name in sorted(FIXTURES.glob("*.jsonl")) for line in name.read_text().splitlines()]


def train_tokenizer(texts: list[str], vocab_size: int = 300) -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return tokenizer


def export_tiny_model(folder: Path, seed: int = 0) -> Path:
    export_decoder(tiny_decoder(seed), folder)
    train_tokenizer(fixture_texts()).save(str(folder / "tokenizer.json"))
    return folder

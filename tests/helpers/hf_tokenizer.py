"""Tokenizers shaped like Hugging Face's, built here (nothing downloads): a byte-level BPE
with Llama 3's special tokens and its post-processor (``<|begin_of_text|>`` before every
text), and one without a BOS (GPT-2's, Qwen's convention)."""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

LLAMA3_SPECIALS = ("<|begin_of_text|>", "<|end_of_text|>", "<|eom_id|>", "<|eot_id|>")
TEXTS = ["The sun rises in the east and sets in the west.", "def main():\n    return 0\n",
         "A tokenizer turns text into ids, and ids back into text."] * 20


def byte_level_bpe(vocab: int = 300, specials: tuple[str, ...] = LLAMA3_SPECIALS) -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=list(specials),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(TEXTS, trainer=trainer)
    return tokenizer


def llama3_tokenizer(path: Path | None = None, vocab: int = 300) -> Tokenizer:
    """Llama 3's conventions: BOS ``<|begin_of_text|>`` (id 0) added by the post-processor,
    EOS ``<|end_of_text|>`` (id 1), chat ends ``<|eom_id|>`` (2) and ``<|eot_id|>`` (3)."""
    tokenizer = byte_level_bpe(vocab)
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|> $B",
        special_tokens=[("<|begin_of_text|>", tokenizer.token_to_id("<|begin_of_text|>"))])
    if path is not None:
        tokenizer.save(str(path))
    return tokenizer


def no_bos_tokenizer(path: Path | None = None, vocab: int = 300) -> Tokenizer:
    """GPT-2's conventions: ``<|endoftext|>`` and no post-processor."""
    tokenizer = byte_level_bpe(vocab, ("<|endoftext|>",))
    if path is not None:
        tokenizer.save(str(path))
    return tokenizer

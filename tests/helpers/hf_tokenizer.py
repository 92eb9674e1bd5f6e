"""Tokenizers shaped like Hugging Face's, built here (nothing downloads): a byte-level BPE
with Llama 3's special tokens and its post-processor (``<|begin_of_text|>`` before every
text), one without a BOS (GPT-2's), and Qwen2.5-Instruct's: no BOS, a chat end, and the
special tokens its three metadata files name differently."""

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


QWEN_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")  # ids 0, 1, 2


def qwen_instruct_metadata(folder: Path, vocab: int = 300) -> None:
    """A Qwen2.5-Instruct-like tokenizer and metadata in ``folder`` (beside its config.json):
    config.json bos 0 / eos 2 (``<|im_end|>``); generation_config.json eos [2, 0] and pad 0;
    tokenizer_config.json no BOS, eos ``<|im_end|>``, pad ``<|endoftext|>``, and a chat template."""
    import json

    byte_level_bpe(vocab, QWEN_SPECIALS).save(str(folder / "tokenizer.json"))
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "bos_token_id": 0, "eos_token_id": 2}))
    (folder / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": 0, "pad_token_id": 0, "eos_token_id": [2, 0], "do_sample": True, "temperature": 0.7}))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": None, "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "chat_template": "{% for m in messages %}<|im_start|>{{ m.content }}<|im_end|>{% endfor %}",
        "clean_up_tokenization_spaces": False, "model_max_length": 131072}))

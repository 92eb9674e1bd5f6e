"""What the eval commands read: validation tokens and prompts.

Validation tokens come from the validation split of a folder made by `layerdrop
prepare`, in order (so every checkpoint sees the same batches), capped by tokens or
batches. Prompts are text (``--prompt``, a file of lines or JSONL, stdin) or token ids
(a JSON list of lists, or the first validation sequences of ``--data``).

Contexts longer than the model's window are handled one way everywhere: they keep
their LAST tokens (the ones nearest to what is predicted), and the command says so
once on stderr (``ContextLimit``).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Iterable, Iterator, Sequence

import torch

from framework.files.nesting import json_document

Batch = tuple[torch.Tensor, torch.Tensor]


# --------------------------------------------------------------------- validation
def capped_batches(batches: Iterable[Batch], *, max_tokens: int | None = None,
                   max_batches: int | None = None) -> Iterator[Batch]:
    """At most ``max_batches`` batches and ``max_tokens`` target tokens (whole sequences:
    the last batch is trimmed; at least one sequence)."""
    used = 0
    for count, (inputs, targets) in enumerate(batches):
        if max_batches is not None and count >= max_batches:
            return
        if max_tokens is not None:
            rows = min(inputs.shape[0], (max_tokens - used) // targets.shape[1])
            if rows < 1 and used > 0:
                return
            inputs, targets = inputs[:max(rows, 1)], targets[:max(rows, 1)]
        used += targets.numel()
        yield inputs, targets


def validation_batches(data_dir: str, *, seq_len: int, batch_size: int, max_batches: int | None = None,
                       model_vocab_size: int | None = None) -> Iterable[Batch]:
    """The validation split of a folder made by `layerdrop prepare`, in order (the whole
    split unless ``max_batches``); the manifest is checked against the model's vocab."""
    from framework.training.data import TokenDataModule  # the data layer is only needed here

    module = TokenDataModule(data_dir, seq_len=seq_len, batch_size=batch_size, val_batches=max_batches or 2**40,
                             model_vocab_size=model_vocab_size)
    module.setup("validate")
    return module.val_dataloader()


class ValidationData:
    """The validation batches of a prepared folder, re-read (in order, so identical) for
    each checkpoint instead of held in memory."""

    def __init__(self, data_dir: str, *, seq_len: int, batch_size: int, max_tokens: int | None,
                 max_batches: int | None, model_vocab_size: int) -> None:
        self.data_dir, self.seq_len, self.batch_size = data_dir, seq_len, batch_size
        self.max_tokens, self.max_batches, self.model_vocab_size = max_tokens, max_batches, model_vocab_size
        if max_tokens is not None:  # read no more batches than the token cap needs
            needed = math.ceil(max_tokens / (seq_len * batch_size))
            self.max_batches = min(max_batches or needed, needed)
        try:
            self.loader = self._loader()  # reads the manifest: bad folders fail here, before any model loads
        except ValueError as err:
            raise ValueError(with_seq_len_hint(str(err), seq_len)) from None
        if len(self.loader) == 0:
            raise ValueError(with_seq_len_hint("its validation split holds no sequence of seq_len + 1 tokens",
                                               seq_len))

    def _loader(self):
        return validation_batches(self.data_dir, seq_len=self.seq_len, batch_size=self.batch_size,
                                  max_batches=self.max_batches, model_vocab_size=self.model_vocab_size)

    def __len__(self) -> int:
        """Batches an iteration yields at most (for progress totals)."""
        return min(len(self.loader), self.max_batches or len(self.loader))

    def __iter__(self) -> Iterator[Batch]:
        return capped_batches(self.loader, max_tokens=self.max_tokens, max_batches=self.max_batches)


def with_seq_len_hint(message: str, seq_len: int, flag: str = "--seq-len") -> str:
    """A data error about sequences that do not fit a split, plus the flag that fixes it
    (the default sequence length is the model's window, often longer than a small split)."""
    if "seq_len + 1" not in message:
        return message
    return f"{message}; pass a smaller {flag} (now {seq_len})"


# ------------------------------------------------------------------------ prompts
def read_prompt_file(path: str, flag: str = "--prompts") -> list[str] | list[list[int]]:
    """Prompts from a file: a ``.json`` file holds a JSON list of strings or of token-id
    lists; a ``.jsonl`` file rows with a "text" (or "prompt") field; any other file (or
    ``-``, stdin) one prompt a line (blank lines skipped; ``\\n`` stands for a newline)."""
    where = "stdin" if path == "-" else repr(path)
    if path == "-":
        text = sys.stdin.read()
    else:
        if not Path(path).is_file():
            raise ValueError(f"{flag} {where} does not exist")
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    if not text.strip():
        raise ValueError(f"{flag} {where} is empty: give one prompt a line (a .jsonl file: rows with a "
                         "\"text\" field; a .json file: a list of strings or of token-id lists)")
    suffix = Path(path).suffix.lower()
    if suffix == ".json":
        return _json_prompts(text, flag, where)
    if suffix == ".jsonl":
        return [_jsonl_prompt(line, flag, f"{where}:{number}")
                for number, line in enumerate(text.splitlines(), start=1) if line.strip()]
    return [line.replace("\\n", "\n") for line in text.splitlines() if line.strip()]


def _json_prompts(text: str, flag: str, where: str) -> list[str] | list[list[int]]:
    try:
        rows = json_document(text, f"{flag} {where}")
    except json.JSONDecodeError as err:
        raise ValueError(f"{flag} {where} is not valid JSON: {err.msg} (line {err.lineno})") from None
    if not isinstance(rows, list):
        kind = {dict: "an object", str: "a string", bool: "a boolean"}.get(type(rows), "a number" if isinstance(
            rows, (int, float)) else "null")
        raise ValueError(f"{flag} {where} is invalid: it holds {kind}, expected a JSON list of strings or of "
                         "non-empty lists of token ids")
    if rows and all(isinstance(r, str) for r in rows):
        return rows
    if rows and all(isinstance(r, list) and r and all(isinstance(t, int) and not isinstance(t, bool) for t in r)
                    for r in rows):
        return rows
    raise ValueError(f"{flag} {where} is invalid: expected a JSON list of strings or of non-empty lists of token ids")


def _jsonl_prompt(line: str, flag: str, where: str) -> str:
    try:
        row = json_document(line, f"{flag} {where}")
    except json.JSONDecodeError as err:
        raise ValueError(f"{flag} {where}: not valid JSON ({err.msg})") from None
    text = row.get("text", row.get("prompt")) if isinstance(row, dict) else None
    if not isinstance(text, str):
        raise ValueError(f"{flag} {where}: each JSONL row needs a \"text\" (or \"prompt\") string")
    return text


def check_text_prompts(prompts: Sequence[str], flag: str = "--prompt") -> None:
    for number, prompt in enumerate(prompts, start=1):
        if prompt == "":
            raise ValueError(f"{flag}: prompt {number} is empty: give some text to continue")


def validation_prompts(data_dir: str, *, count: int, length: int, model_vocab_size: int | None = None,
                       offset: int = 0) -> list[list[int]]:
    """``count`` validation sequences of a prepared folder, ``length`` tokens each, from the
    ``offset``-th (the first 0..offset-1 passed over)."""
    out: list[list[int]] = []
    batches = math.ceil((offset + count) / count)  # batches of ``count``, in order, as without an offset
    for inputs, _ in validation_batches(data_dir, seq_len=length, batch_size=count, max_batches=batches,
                                        model_vocab_size=model_vocab_size):
        out.extend(row.tolist() for row in inputs)
        if len(out) >= offset + count:
            break
    if len(out) <= offset:
        raise ValueError(f"--data {data_dir!r} has {len(out)} validation sequences of {length} tokens: none is left "
                         f"past --prompt-offset {offset}" if offset else
                         f"--data {data_dir!r} has no validation sequences of {length} tokens")
    return out[offset:offset + count]


def check_vocabulary(prompts: Sequence[Sequence[int]], vocab_size: int) -> None:
    ids = [t for p in prompts for t in p]
    bad = [t for t in ids if not 0 <= t < vocab_size]
    if bad:
        raise ValueError(f"prompt token id {bad[0]} is invalid for a vocabulary of {vocab_size}")


def load_prompts(*, texts: Sequence[str] | None = None, prompts_file: str | None = None, data: str | None = None,
                 count: int | None = None, length: int = 32, codec=None, vocab_size: int | None = None,
                 offset: int = 0) -> tuple[list[list[int]], list[str] | None]:
    """(token ids, texts or None) of at most ``count`` prompts from one source: ``texts``
    (``--prompt``), a file (``--prompts``) or a prepared folder (``--data``), the first
    ``offset`` passed over. Text needs ``codec`` (a ``framework.tokenizer.TextCodec``, or a
    callable returning one)."""
    if texts is not None:
        check_text_prompts(texts)
        rows: list[str] | list[list[int]] = list(texts)
    elif prompts_file is not None:
        rows = read_prompt_file(prompts_file)
        if rows and isinstance(rows[0], str):
            check_text_prompts(rows, f"--prompts {prompts_file!r}")  # type: ignore[arg-type]
    else:
        rows = validation_prompts(str(data), count=count or 8, length=length, model_vocab_size=vocab_size,
                                  offset=offset)
        offset = 0
    if offset and len(rows) <= offset:
        raise ValueError(f"--prompt-offset {offset} is invalid: it passes over all {len(rows)} prompts")
    rows = rows[offset:]
    rows = rows[:count] if count is not None else rows
    if rows and isinstance(rows[0], str):
        codec = codec if hasattr(codec, "encode_prompt") else codec()  # a TextCodec, or what loads one
        ids = [codec.encode_prompt(text) for text in rows]  # type: ignore[arg-type, union-attr]
        strings: list[str] | None = list(rows)  # type: ignore[arg-type]
    else:
        ids, strings = [list(r) for r in rows], None  # type: ignore[arg-type]
    if vocab_size is not None:
        check_vocabulary(ids, vocab_size)
    return ids, strings


class ContextLimit:
    """Cuts contexts to the model's window, keeping their last tokens, and says so once."""

    def __init__(self, max_seq_len: int, what: str = "prompt") -> None:
        self.max_seq_len, self.what = max_seq_len, what
        self.cut: list[tuple[int, int]] = []  # (length before, after) per cut context
        self.reserved = 0  # the most room kept for generated tokens by a cut

    def fit(self, ids: Sequence[int], reserve: int = 0) -> list[int]:
        """``ids`` cut to its last ``max_seq_len - reserve`` tokens (``reserve``: room kept
        for the tokens to generate)."""
        room = max(1, self.max_seq_len - reserve)
        if len(ids) <= room:
            return list(ids)
        self.cut.append((len(ids), room))
        self.reserved = max(self.reserved, reserve)
        return list(ids[-room:])

    def fit_length(self, length: int, flag: str) -> int:
        """A sequence length asked for with ``flag``, at most the window (said once)."""
        if length <= self.max_seq_len:
            return length
        print(f"note: {flag} {length} is longer than the model's context (max_seq_len {self.max_seq_len}): "
              f"{self.what}s of {self.max_seq_len} tokens are used", file=sys.stderr)
        return self.max_seq_len

    def report(self, stream=None) -> str | None:
        """One line on stderr if anything was cut."""
        if not self.cut:
            return None
        longest = max(before for before, _ in self.cut)
        kept = min(after for _, after in self.cut)
        room = (f"the model's context (max_seq_len {self.max_seq_len}) less the {self.reserved} tokens to generate "
                f"(--max-new-tokens)" if self.reserved else f"the model's context (max_seq_len {self.max_seq_len})")
        line = (f"note: {len(self.cut)} {self.what}(s) longer than {room} kept only their last {kept} tokens "
                f"(the longest had {longest})")
        print(line, file=stream or sys.stderr)
        return line


__all__ = ["Batch", "capped_batches", "validation_batches", "ValidationData", "read_prompt_file",
           "check_text_prompts", "validation_prompts", "load_prompts", "check_vocabulary", "ContextLimit"]

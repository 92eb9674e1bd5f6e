"""What each sequence of a decoding batch has written, and what the run cost.

``Transcripts`` is the bookkeeping every decoder shares (plain, dynamic and
self-speculative): it appends each row's new tokens until the sequence ends at EOS,
at a stop string (``StopStrings``) or after ``max_new_tokens``, and says which batch
rows still run. ``GenerationStats`` holds the counts and clocks of a run.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

import torch

OnTokens = Callable[[int, list[int]], None]


class StopStrings:
    """Whether a sequence's text now contains a stop string (only its tail is decoded:
    a stop string of c characters spans at most 4·c byte-level tokens)."""

    def __init__(self, stops: Sequence[str], decode: Callable[[list[int]], str]) -> None:
        self.stops = [s for s in stops if s]
        self.decode = decode
        self.tail = 4 * max((len(s) for s in self.stops), default=0) + 4

    def hit(self, tokens: list[int]) -> bool:
        if not self.stops:
            return False
        text = self.decode(tokens[-self.tail:])
        return any(s in text for s in self.stops)

    def cut(self, text: str) -> str:
        """``text`` up to (not including) its first stop string."""
        ends = [text.find(s) for s in self.stops if s in text]
        return text[:min(ends)] if ends else text


@dataclass
class Transcript:
    tokens: list[int] = field(default_factory=list)
    blocks: list[float] = field(default_factory=list)  # blocks run for each token (incl. adapters)
    finish_reason: str | None = None  # "eos", "stop" or "length"


class Transcripts:
    """What each sequence of a batch has written, and which batch rows still run.
    ``running[i]`` is the sequence number of batch row i."""

    def __init__(self, count: int, max_new_tokens: int, *, eos_id: int | Iterable[int] | None = None,
                 stop: StopStrings | None = None, on_tokens: OnTokens | None = None) -> None:
        if not (isinstance(max_new_tokens, int) and max_new_tokens >= 1):
            raise ValueError(f"max_new_tokens={max_new_tokens!r} is invalid: must be an integer >= 1")
        self.items = [Transcript() for _ in range(count)]
        self.running = list(range(count))
        self.max_new_tokens, self.stop, self.on_tokens = max_new_tokens, stop, on_tokens
        # every id that ends a text (an eos_token_id list: Llama-3.x-Instruct's <|eot_id|> and <|end_of_text|>)
        self.eos_ids = frozenset([] if eos_id is None else [eos_id] if isinstance(eos_id, int) else eos_id)

    def add(self, row: int, tokens: Sequence[int], blocks: Sequence[float]) -> int:
        """Append batch row ``row``'s new tokens until it ends; the number appended."""
        number = self.running[row]
        item = self.items[number]
        added = []
        for token, cost in zip(tokens, blocks):
            if item.finish_reason is not None:
                break
            if int(token) in self.eos_ids:
                item.finish_reason = "eos"
                break
            item.tokens.append(int(token))
            item.blocks.append(float(cost))
            added.append(int(token))
            if self.stop is not None and self.stop.hit(item.tokens):
                item.finish_reason = "stop"
            elif len(item.tokens) >= self.max_new_tokens:
                item.finish_reason = "length"
        if added and self.on_tokens is not None:
            self.on_tokens(number, added)
        return len(added)

    def finished_rows(self) -> torch.Tensor | None:
        """The batch rows to keep if some sequence ended since the last call (and drop
        the ended ones from ``running``), else None."""
        keep = [i for i, n in enumerate(self.running) if self.items[n].finish_reason is None]
        if len(keep) == len(self.running):
            return None
        self.running = [self.running[i] for i in keep]
        return torch.tensor(keep, dtype=torch.long)

    @property
    def done(self) -> bool:
        return not self.running

    def count(self, stats: "GenerationStats") -> "GenerationStats":
        """``stats`` with the tokens written and the blocks they cost added."""
        stats.new_tokens += sum(len(item.tokens) for item in self.items)
        stats.block_evaluations += sum(sum(item.blocks) for item in self.items)
        return stats


@dataclass
class GenerationStats:
    """Counts and clocks of one or more decoding runs (prefill included in the time)."""

    sequences: int = 0
    new_tokens: int = 0
    seconds: float = 0.0
    cpu_seconds: float = 0.0
    block_evaluations: float = 0.0  # Σ over generated tokens of the blocks run for it (prefill excluded)
    prefill_seconds: float = 0.0
    steps: int = 0  # forwards after the prefill (plain decoding: one per token)
    rounds: int = 0  # self-speculative decoding only
    drafted: int = 0  # draft tokens proposed, summed over rows
    accepted: int = 0  # of which the verifier accepted (each row's own acceptance)
    draft_steps: int = 0
    draft_seconds: float = 0.0  # the draft's forwards (and sampling its tokens)
    verify_seconds: float = 0.0  # the verifying forward
    bookkeeping_seconds: float = 0.0  # acceptance, cache crop, transcripts: a round's work beside the forwards
    compactions: int = 0  # a batch's cache compacted: the room for the holes its rows left ran out

    def add(self, other: "GenerationStats") -> None:
        for name in self.__dataclass_fields__:
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def summary(self) -> dict:
        out = {"sequences": self.sequences, "new_tokens": self.new_tokens, "seconds": self.seconds,
               "cpu_seconds": self.cpu_seconds,
               "tokens_per_s": self.new_tokens / self.seconds if self.seconds else float("nan"),
               "layers_per_token": self.block_evaluations / self.new_tokens if self.new_tokens else float("nan")}
        if self.rounds:
            out.update(rounds=self.rounds, drafted=self.drafted, accepted=self.accepted,
                       acceptance_rate=self.accepted / self.drafted if self.drafted else float("nan"),
                       tokens_per_round=self.new_tokens / self.rounds, time_shares=self.time_shares(),
                       compactions=self.compactions)
        return out

    def time_shares(self) -> dict[str, float]:
        """Where a speculative run's wall time went, as shares of it: the prompt's prefill, the
        draft's forwards, the verifying forwards, the rounds' bookkeeping, and the rest (the
        loop between rounds: finished rows dropped from the batch and the cache)."""
        parts = {"prefill": self.prefill_seconds, "draft": self.draft_seconds, "verify": self.verify_seconds,
                 "bookkeeping": self.bookkeeping_seconds}
        parts["between_rounds"] = max(0.0, self.seconds - sum(parts.values()))
        return {name: value / self.seconds if self.seconds else float("nan") for name, value in parts.items()}


class Clock:
    """Wall and process time since creation."""

    def __init__(self) -> None:
        self.wall, self.cpu = time.perf_counter(), time.process_time()

    def stop(self, stats: GenerationStats) -> None:
        stats.seconds += time.perf_counter() - self.wall
        stats.cpu_seconds += time.process_time() - self.cpu


__all__ = ["OnTokens", "StopStrings", "Transcript", "Transcripts", "GenerationStats", "Clock"]

"""Batched autoregressive decoding with the KV cache, for every depth the model allows.

Prompts of different lengths decode together: they are left-padded, the cache marks
the padding and no query attends to it (ALiBi's bias depends only on query-key
distance, which left padding leaves alone), so a padded batch gives each prompt the
tokens it gets alone. Each step feeds one token per sequence; a sequence leaves the
batch (and the cache) as soon as it ends, at EOS, at a stop string, or after
``max_new_tokens``.

A *route* says which blocks a token goes through and which head reads them:
``StaticRoute`` — the full model, an early exit (optionally through a Balcony exit
adapter) or a skip set, the same for every token; ``eval.dynamic_exit.DynamicExit`` —
a per-token confident early exit. Self-speculative decoding (eval/speculative.py)
shares the bookkeeping (``Transcripts``) but not the step.

The prompt is prefilled but for its last token, which the first step feeds: every
generated token then comes out of ``route.step``, the first one included.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from eval.sampling import Sampling, row_generators
from framework.kv_cache import KVCache
from framework.model import Block, Decoder

OnTokens = Callable[[int, list[int]], None]


# ----------------------------------------------------------------------- routes
class StaticRoute:
    """Every token runs the same blocks: ``exit_layer`` K (blocks 0..K-1), minus
    ``skip_layers``; with ``adapter`` (the exit adapter at K) its block reads the exit
    state before the shared final norm + head."""

    def __init__(self, model: Decoder, *, exit_layer: int | None = None, skip_layers: Sequence[int] = (),
                 adapter: Block | None = None) -> None:
        self.layers = model.active_layers(exit_layer, skip_layers)  # validates both
        if adapter is not None and (exit_layer is None or skip_layers):
            raise ValueError("an exit adapter reads one exit: give exit_layer (and no skip_layers)")
        self.adapter = adapter
        self.extra_layers = 0 if adapter is None else adapter.attn.layer_index - len(model.blocks) + 1
        self.blocks_per_token = len(self.layers) + (adapter is not None)

    def prefill(self, model: Decoder, tokens: torch.Tensor, cache: KVCache, padding: torch.Tensor) -> None:
        self._hidden(model, tokens, cache, padding)

    def step(self, model: Decoder, tokens: torch.Tensor, cache: KVCache) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits [B, V] of the next token after ``tokens`` [B, 1], and blocks run per row."""
        h = self._hidden(model, tokens, cache, None)
        blocks = torch.full((tokens.shape[0],), self.blocks_per_token, dtype=torch.long)
        return model.logits(h[:, -1]), blocks

    def select_rows(self, rows: torch.Tensor) -> None:
        pass

    def _hidden(self, model: Decoder, tokens: torch.Tensor, cache: KVCache,
                padding: torch.Tensor | None) -> torch.Tensor:
        if padding is not None:
            cache.mark_padding(padding)
        bias = model.attention_bias(tokens.shape[1], cache)
        h = model.run_blocks(model.embed(tokens), self.layers, bias=bias, cache=cache)
        if self.adapter is not None:
            h = self.adapter(h, bias, None, cache)
        cache.advance(tokens.shape[1])
        return h


# ------------------------------------------------------------------ bookkeeping
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

    def __init__(self, count: int, max_new_tokens: int, *, eos_id: int | None = None,
                 stop: StopStrings | None = None, on_tokens: OnTokens | None = None) -> None:
        if not (isinstance(max_new_tokens, int) and max_new_tokens >= 1):
            raise ValueError(f"max_new_tokens={max_new_tokens!r} is invalid: must be an integer >= 1")
        self.items = [Transcript() for _ in range(count)]
        self.running = list(range(count))
        self.max_new_tokens, self.eos_id, self.stop, self.on_tokens = max_new_tokens, eos_id, stop, on_tokens

    def add(self, row: int, tokens: Sequence[int], blocks: Sequence[float]) -> int:
        """Append batch row ``row``'s new tokens until it ends; the number appended."""
        number = self.running[row]
        item = self.items[number]
        added = []
        for token, cost in zip(tokens, blocks):
            if item.finish_reason is not None:
                break
            if token == self.eos_id:
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
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0

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
                       tokens_per_round=self.new_tokens / self.rounds)
        return out


class Clock:
    """Wall and process time since creation."""

    def __init__(self) -> None:
        self.wall, self.cpu = time.perf_counter(), time.process_time()

    def stop(self, stats: GenerationStats) -> None:
        stats.seconds += time.perf_counter() - self.wall
        stats.cpu_seconds += time.process_time() - self.cpu


def left_padded(prompts: Sequence[Sequence[int]], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """tokens [B, W] with each prompt at the right end, and padding [B, W] (True = none)."""
    width = max(len(p) for p in prompts)
    tokens = torch.zeros(len(prompts), width, dtype=torch.long)
    padding = torch.ones(len(prompts), width, dtype=torch.bool)
    for row, prompt in enumerate(prompts):
        if prompt:
            tokens[row, width - len(prompt):] = torch.as_tensor(list(prompt), dtype=torch.long)
            padding[row, width - len(prompt):] = False
    return tokens.to(device), padding.to(device)


def check_prompts(prompts: Sequence[Sequence[int]]) -> None:
    if not prompts:
        raise ValueError("no prompts: give at least one")
    empty = [i for i, p in enumerate(prompts) if len(p) == 0]
    if empty:
        raise ValueError(f"prompt {empty[0]} is empty: every prompt needs at least one token")


# -------------------------------------------------------------------- generator
class BatchGenerator:
    """Decodes a batch of prompts along ``route`` (StaticRoute, DynamicExit)."""

    def __init__(self, model: Decoder, route=None, *, sampling: Sampling = Sampling(), seed: int = 0) -> None:
        self.model, self.route = model, route or StaticRoute(model)
        self.sampling, self.seed = sampling, seed

    @torch.inference_mode()
    def generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: int, *, eos_id: int | None = None,
                 stop: StopStrings | None = None, on_tokens: OnTokens | None = None,
                 numbers: Sequence[int] | None = None) -> tuple[list[Transcript], GenerationStats]:
        """Continuations of ``prompts`` (token-id lists, decoded together as one batch).
        ``numbers`` name the sequences for the sampler's seeds (default 0..B-1)."""
        check_prompts(prompts)
        clock, stats = Clock(), GenerationStats(sequences=len(prompts))
        book = Transcripts(len(prompts), max_new_tokens, eos_id=eos_id, stop=stop, on_tokens=on_tokens)
        device = self.model.embed.weight.device
        tokens, padding = left_padded(prompts, device)
        cache = self.model.new_cache(len(prompts), tokens.shape[1] + max_new_tokens,
                                     extra_layers=self.route.extra_layers)
        if tokens.shape[1] > 1:
            self.route.prefill(self.model, tokens[:, :-1], cache, padding[:, :-1])
        stats.prefill_seconds = time.perf_counter() - clock.wall
        generators = row_generators(self.seed, list(numbers if numbers is not None else range(len(prompts))))
        last = tokens[:, -1:]
        while True:
            logits, blocks = self.route.step(self.model, last, cache)
            stats.steps += 1
            chosen, _ = self.sampling.choose(logits, generators)
            for row, (token, cost) in enumerate(zip(chosen.tolist(), blocks.tolist())):
                book.add(row, [token], [cost])
            keep = book.finished_rows()
            if book.done:
                break
            if keep is not None:
                cache.select_rows(keep)
                self.route.select_rows(keep)
                chosen = chosen[keep.to(chosen.device)]
                generators = [generators[i] for i in keep.tolist()]
            last = chosen[:, None]
        clock.stop(stats)
        return book.items, book.count(stats)


def generate_in_batches(decode: Callable[..., tuple[list[Transcript], GenerationStats]],
                        prompts: Sequence[Sequence[int]], batch_size: int, **options
                        ) -> tuple[list[Transcript], GenerationStats]:
    """``decode`` (a generator's ``generate``) over batches of ``batch_size`` prompts of
    similar lengths (less padding), results back in the prompts' order; sequence numbers
    (the sampler's seeds) are the prompts' positions, so batching changes no output."""
    if not (isinstance(batch_size, int) and batch_size >= 1):
        raise ValueError(f"batch_size={batch_size!r} is invalid: must be an integer >= 1")
    check_prompts(prompts)
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    results: list[Transcript | None] = [None] * len(prompts)
    total = GenerationStats()
    on_tokens = options.pop("on_tokens", None)
    progress = options.pop("progress", None)
    for start in range(0, len(order), batch_size):
        chunk = order[start:start + batch_size]
        relay = (lambda n, ids, chunk=chunk: on_tokens(chunk[n], ids)) if on_tokens else None
        items, stats = decode([prompts[i] for i in chunk], numbers=chunk, on_tokens=relay, **options)
        for i, item in zip(chunk, items):
            results[i] = item
        total.add(stats)
        if progress is not None:
            progress(len(chunk))
    return results, total  # type: ignore[return-value]


__all__ = ["StaticRoute", "StopStrings", "Transcript", "Transcripts", "GenerationStats", "Clock", "left_padded",
           "check_prompts", "BatchGenerator", "generate_in_batches"]

"""Batched autoregressive decoding with the KV cache, along any route.

Prompts of different lengths decode together: they are left-padded, the cache marks
the padding and no query attends to it (ALiBi's bias depends only on query-key
distance, which left padding leaves alone), so a padded batch gives each prompt the
tokens it gets alone. Each step feeds one token per sequence; a sequence leaves the
batch (and the cache) as soon as it ends, at EOS, at a stop string, or after
``max_new_tokens``.

A *route* (the ``Route`` protocol) says which blocks a token goes through and which
head reads them: ``eval.decoding.static_route.StaticRoute`` (full, early exit, skip
set, exit adapter) or ``eval.decoding.dynamic_exit.DynamicExit`` (a per-token confident
early exit). Each calls the model's one forward step, ``Decoder.step``. Self-speculative
decoding (eval/decoding/speculative.py) shares the bookkeeping (``Transcripts``) but
not the loop.

The prompt is prefilled but for its last token, which the first step feeds: every
generated token then comes out of ``route.step``, the first one included.
"""

from __future__ import annotations

import time
from typing import Callable, Protocol, Sequence

import torch

from eval.decoding.compiled_step import CompiledStep, decoding_cache
from eval.decoding.sampling import Sampling, draw, row_generators, sequence_keys, uniforms
from eval.decoding.static_route import StaticRoute
from eval.decoding.transcripts import Clock, GenerationStats, OnTokens, StopStrings, Transcript, Transcripts
from framework.model.kv_cache import KVCache
from framework.model.decoder import Decoder


class Route(Protocol):
    """How a token goes through the model, one ``Decoder.step`` per call."""

    extra_layers: int  # cache slots after the model's own layers (exit adapters' K/V)

    def prefill(self, model: Decoder, tokens: torch.Tensor, cache: KVCache, padding: torch.Tensor) -> None:
        """Write the K/V of the prompt ``tokens`` [B, T] (``padding``: where there is none)."""

    def step(self, model: Decoder, tokens: torch.Tensor, cache: KVCache) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits [B, V] of the next token after ``tokens`` [B, 1], and the blocks each row ran."""

    def select_rows(self, rows: torch.Tensor) -> None:
        """Only ``rows`` of the batch go on (the others ended)."""


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

    def __init__(self, model: Decoder, route: Route | None = None, *, sampling: Sampling = Sampling(), seed: int = 0,
                 seed_by: str = "prompt") -> None:
        sequence_keys([], None, seed_by)  # checks seed_by
        self.model, self.route = model, route or StaticRoute(model)
        self.sampling, self.seed, self.seed_by = sampling, seed, seed_by

    @torch.inference_mode()
    def generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: int, *, eos_id: int | Sequence[int] | None = None,
                 stop: StopStrings | None = None, on_tokens: OnTokens | None = None,
                 numbers: Sequence[int] | None = None) -> tuple[list[Transcript], GenerationStats]:
        """Continuations of ``prompts`` (token-id lists, decoded together as one batch).
        ``numbers``: the sequences' positions in the input (default 0..B-1), what the
        sampler's streams are seeded from with ``seed_by="position"``."""
        check_prompts(prompts)
        clock, stats = Clock(), GenerationStats(sequences=len(prompts))
        book = Transcripts(len(prompts), max_new_tokens, eos_id=eos_id, stop=stop, on_tokens=on_tokens)
        device = self.model.embed.weight.device
        tokens, padding = left_padded(prompts, device)
        cache = decoding_cache(self.model, len(prompts), tokens.shape[1] + max_new_tokens,
                               extra_layers=self.route.extra_layers, static_shapes=isinstance(self.route, StaticRoute))
        if tokens.shape[1] > 1:
            self.route.prefill(self.model, tokens[:, :-1], cache, padding[:, :-1])
        stats.prefill_seconds = time.perf_counter() - clock.wall
        generators = row_generators(self.seed, sequence_keys(prompts, numbers, self.seed_by))
        last = tokens[:, -1:]
        while True:
            chosen, blocks = self._next(last, cache, generators)
            stats.steps += 1
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

    def _next(self, last: torch.Tensor, cache: KVCache, generators: list[torch.Generator]
              ) -> tuple[torch.Tensor, torch.Tensor]:
        """The next token of every row [B] after ``last`` [B, 1], and the blocks each row ran."""
        compiled = self.model.__dict__.get("step")
        if isinstance(compiled, CompiledStep) and isinstance(self.route, StaticRoute):
            return self._fused_next(compiled, last, cache, generators)
        logits, blocks = self.route.step(self.model, last, cache)
        return self.sampling.choose(logits, generators)[0], blocks

    def _fused_next(self, compiled: CompiledStep, last: torch.Tensor, cache: KVCache,
                    generators: list[torch.Generator]) -> tuple[torch.Tensor, torch.Tensor]:
        """``_next`` as one compiled graph: the step, its head and the choice (argmax, or the
        inverse-CDF draw of each row's uniform, drawn first as ``Sampling.choose`` draws it)."""
        route, model, sampling = self.route, self.model, self.sampling
        blocks = route.blocks(last.shape[0])
        # the route's structure names the graph: another route through the same blocks and exits reuses it
        key = (tuple(route.layers), tuple((k, route.exits[k]) for k in sorted(route.exits)))
        if sampling.greedy:
            def greedy(forward, last: torch.Tensor, cache: KVCache) -> torch.Tensor:
                return route.step(model, last, cache, forward)[0].argmax(-1)

            return compiled.fused(("greedy step", *key), greedy, last, cache), blocks

        def sampled(forward, last: torch.Tensor, cache: KVCache, u: torch.Tensor) -> torch.Tensor:
            return draw(sampling.probabilities(route.step(model, last, cache, forward)[0]), u)

        u = uniforms(generators, last.device)
        return compiled.fused(("sampled step", *key, sampling), sampled, last, cache, u), blocks


def generate_in_batches(decode: Callable[..., tuple[list[Transcript], GenerationStats]],
                        prompts: Sequence[Sequence[int]], batch_size: int, **options
                        ) -> tuple[list[Transcript], GenerationStats]:
    """``decode`` (a generator's ``generate``) over batches of ``batch_size`` prompts of
    similar lengths (less padding), results back in the prompts' order; the sequences'
    numbers are the prompts' positions, so batching changes no output."""
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


__all__ = ["Route", "left_padded", "check_prompts", "BatchGenerator", "generate_in_batches"]

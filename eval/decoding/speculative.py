"""Self-speculative decoding: the model's own layers draft, the full model verifies.

Draft & Verify (Zhang et al., 2024): the draft is the model with a skip set S (those
blocks passed through by the residual). Each round it proposes up to γ tokens, one
forward each; the full model then scores the pending token and every proposal in ONE
forward from the pre-draft cache length, which overwrites whatever the draft wrote
there, and the cache is cropped to the accepted prefix.

Cache invariant between rounds: ``cache.length`` covers every output token but the
last one (the "pending" token, whose K/V the next forward writes).

- Greedy verification accepts the longest draft prefix the full model would have
  produced itself, then appends the full model's own next token: the output is plain
  greedy decoding's, token for token.
- Sampling uses the rejection step of Leviathan et al. (2023): accept a draft token x
  with probability min(1, p(x)/q(x)), else resample from normalize(max(0, p - q));
  this leaves the full model's distribution p unchanged whatever the draft q is (p and
  q are the filtered distributions of eval/sampling.py).
- γ is fixed, or adaptive: drafting stops once the draft's top probability falls under
  a threshold that moves after every round toward a target acceptance rate.

The drafts (a skip set, an early exit, an exit adapter) are eval/decoding/drafts.py's.

Batches: the rows of a batch share one cache length, so a round keeps, in every row,
the shortest accepted prefix m of all rows, plus one token: the verifier's where the
row's acceptance stopped at m, the row's accepted draft token where it went further.
Each row's tokens are still the verified ones (greedy output is plain greedy's; a
sampled row keeps its distribution: m depends on the other rows' independent draws
and on this row's tokens up to m only). Rows that end (EOS, a stop string) leave the
batch between rounds.
"""

from __future__ import annotations

import time
from typing import Sequence

import torch

from eval.decoding.batch import BatchGenerator, check_prompts, left_padded
from eval.decoding.drafts import Draft
from eval.decoding.sampling import Sampling, draw, row_generators, uniforms
from eval.decoding.static_route import StaticRoute
from eval.decoding.transcripts import Clock, GenerationStats, OnTokens, StopStrings, Transcript, Transcripts
from framework.kv_cache import KVCache
from framework.model import Decoder


class AdaptiveThreshold:
    """Stop drafting when the draft's top probability falls under ``threshold``; after
    each round move the threshold up when the (smoothed) acceptance rate is under
    ``target`` (draft less), down when above (draft more)."""

    def __init__(self, target: float = 0.8, threshold: float = 0.5, step: float = 0.05,
                 momentum: float = 0.5) -> None:
        for name, value in (("target", target), ("threshold", threshold)):
            if not 0.0 < value < 1.0:
                raise ValueError(f"{name}={value!r} is invalid: must be in (0, 1)")
        self.target, self.threshold, self.step, self.momentum = target, threshold, step, momentum
        self.rate = target

    def stop(self, top_probability: float) -> bool:
        return top_probability < self.threshold

    def update(self, accepted: int, drafted: int) -> None:
        if drafted == 0:
            return
        self.rate = self.momentum * self.rate + (1 - self.momentum) * accepted / drafted
        move = self.step if self.rate < self.target else -self.step
        self.threshold = min(1.0, max(0.0, self.threshold + move))


class SelfSpeculativeDecoder:
    """Batched self-speculative decoding with one of the drafts above."""

    def __init__(self, model: Decoder, draft: Draft, *, gamma: int = 5,
                 adaptive: AdaptiveThreshold | None = None, temperature: float = 0.0,
                 sampling: Sampling | None = None, seed: int = 0,
                 generator: torch.Generator | None = None) -> None:
        draft.check(len(model.blocks))
        if not (isinstance(gamma, int) and not isinstance(gamma, bool) and gamma >= 1):
            raise ValueError(f"gamma={gamma!r} is invalid: the draft length must be an integer >= 1")
        self.sampling = sampling or Sampling(temperature=temperature)
        self.model, self.draft, self.gamma, self.adaptive, self.seed = model, draft, gamma, adaptive, seed
        self.generator = generator  # batch-1 ``generate`` draws from it when given

    @property
    def temperature(self) -> float:
        return self.sampling.temperature

    def generate(self, prompt: torch.Tensor | Sequence[int], max_new_tokens: int) -> tuple[list[int], GenerationStats]:
        """``max_new_tokens`` tokens after one prompt (no EOS or stop string)."""
        prompt = torch.as_tensor(prompt).view(-1).tolist()
        generators = [self.generator] if self.generator is not None else None
        items, stats = self.generate_batch([prompt], max_new_tokens, generators=generators)
        return items[0].tokens, stats

    @torch.inference_mode()
    def generate_batch(self, prompts: Sequence[Sequence[int]], max_new_tokens: int, *, eos_id: int | None = None,
                       stop: StopStrings | None = None, on_tokens: OnTokens | None = None,
                       numbers: Sequence[int] | None = None,
                       generators: list[torch.Generator] | None = None) -> tuple[list[Transcript], GenerationStats]:
        check_prompts(prompts)
        model, num_layers = self.model, len(self.model.blocks)
        clock, stats = Clock(), GenerationStats(sequences=len(prompts))
        book = Transcripts(len(prompts), max_new_tokens, eos_id=eos_id, stop=stop, on_tokens=on_tokens)
        tokens, padding = left_padded(prompts, model.embed.weight.device)
        cache = model.new_cache(len(prompts), tokens.shape[1] + max_new_tokens + 1,
                                extra_layers=self.draft.extra_layers)
        generators = generators or row_generators(self.seed, list(numbers or range(len(prompts))))
        logits = self.draft.prefill(model, tokens, cache, padding if bool(padding.any()) else None)
        stats.prefill_seconds = time.perf_counter() - clock.wall
        pending, _ = self.sampling.choose(logits, generators)
        for row, token in enumerate(pending.tolist()):
            book.add(row, [token], [num_layers])
        pending = pending[:, None]
        while True:
            keep = book.finished_rows()
            if book.done:
                break
            if keep is not None:
                cache.select_rows(keep)
                pending = pending[keep.to(pending.device)]
                generators = [generators[i] for i in keep.tolist()]
            produced = len(book.items[book.running[0]].tokens)
            pending = self._round(pending, cache, max_new_tokens - produced, book, generators, stats)
        clock.stop(stats)
        return book.items, book.count(stats)

    def _round(self, pending: torch.Tensor, cache: KVCache, budget: int, book: Transcripts,
               generators: list[torch.Generator], stats: GenerationStats) -> torch.Tensor:
        """One draft-and-verify round over the batch; the new pending tokens [B, 1]."""
        start, tick = cache.length, time.perf_counter()
        drafts, draft_probs = self._draft(pending, cache, budget, generators)
        inputs = torch.cat([pending] + drafts, dim=1)
        mid = time.perf_counter()
        target_logits = self.draft.verify(self.model, inputs, cache, start)
        k = len(drafts)
        if self.sampling.greedy:
            accepted, nexts = self._accept_greedy(inputs[:, 1:], target_logits)
        else:
            accepted, nexts = self._accept_sampled(inputs[:, 1:], draft_probs, target_logits, generators)
        kept = min(accepted)
        cache.crop(start + 1 + kept)
        rows = inputs[:, 1:].tolist()
        new = torch.tensor([row[:kept] + [nxt if count == kept else row[kept]]
                            for row, count, nxt in zip(rows, accepted, nexts)], device=inputs.device)
        cost = (k * self.draft.layers_run(len(self.model.blocks)) + (k + 1) * len(self.model.blocks)) / (kept + 1)
        for row, row_tokens in enumerate(new.tolist()):
            book.add(row, row_tokens, [cost] * len(row_tokens))
        stats.draft_seconds += mid - tick
        stats.verify_seconds += time.perf_counter() - mid
        stats.rounds += 1
        stats.draft_steps += k
        stats.drafted += k * len(accepted)
        stats.accepted += sum(accepted)
        if self.adaptive is not None:
            self.adaptive.update(sum(accepted), k * len(accepted))
        return new[:, -1:]

    def _draft(self, pending: torch.Tensor, cache: KVCache, budget: int, generators: list[torch.Generator]
               ) -> tuple[list[torch.Tensor], list[torch.Tensor | None]]:
        """Up to γ proposals per row; the verify pass always adds one token, hence budget - 1."""
        self.draft.begin_round()
        drafts, probs, token = [], [], pending
        for _ in range(min(self.gamma, budget - 1)):
            logits = self.draft.step(self.model, token, cache)
            chosen, q = self.sampling.choose(logits, generators)
            token = chosen[:, None]
            drafts.append(token)
            probs.append(q)
            if self.adaptive is not None:
                top = (q if q is not None else torch.softmax(logits.float(), -1)).max(-1).values
                if self.adaptive.stop(float(top.min())):  # the batch keeps its least sure row's prefix
                    break
        return drafts, probs

    @staticmethod
    def _accept_greedy(drafts: torch.Tensor, target_logits: torch.Tensor) -> tuple[list[int], list[int]]:
        """Per row: accepted draft tokens, and the verifier's token after them."""
        targets = target_logits.argmax(-1)  # [B, k + 1]
        if drafts.shape[1] == 0:
            return [0] * targets.shape[0], targets[:, 0].tolist()
        accepted = (drafts == targets[:, :-1]).int().cumprod(1).sum(1)
        nexts = targets.gather(1, accepted[:, None])[:, 0]
        return accepted.tolist(), nexts.tolist()

    def _accept_sampled(self, drafts: torch.Tensor, draft_probs: list[torch.Tensor], target_logits: torch.Tensor,
                        generators: list[torch.Generator]) -> tuple[list[int], list[int]]:
        p = self.sampling.probabilities(target_logits.flatten(0, 1)).view(*target_logits.shape[:2], -1)
        accepted, nexts = [], []
        for row, generator in enumerate(generators):
            count, token = self._accept_row(drafts[row].tolist(), [q[row] for q in draft_probs], p[row], generator)
            accepted.append(count)
            nexts.append(token)
        return accepted, nexts

    @staticmethod
    def _accept_row(drafts: list[int], qs: list[torch.Tensor], p: torch.Tensor, generator: torch.Generator
                    ) -> tuple[int, int]:
        for i, (token, q) in enumerate(zip(drafts, qs)):
            u = float(uniforms([generator])[0])
            if u * float(q[token]) < float(p[i, token]):  # u < p/q without dividing by q
                continue
            residual = (p[i] - q).clamp_min(0.0)
            # its sum is 0 only when p == q, where a rejection has probability 0.
            dist = residual if float(residual.sum()) > 0 else p[i]
            return i, int(draw(dist[None], uniforms([generator], dist.device))[0])
        k = len(drafts)
        return k, int(draw(p[k][None], uniforms([generator], p.device))[0])


def plain_decode(model: Decoder, prompt: torch.Tensor | Sequence[int], max_new_tokens: int, *,
                 temperature: float = 0.0, seed: int = 0) -> tuple[list[int], GenerationStats]:
    """Ordinary decoding of one prompt with the full model and a KV cache (no EOS)."""
    generator = BatchGenerator(model, StaticRoute(model), sampling=Sampling(temperature=temperature), seed=seed)
    items, stats = generator.generate([torch.as_tensor(prompt).view(-1).tolist()], max_new_tokens)
    return items[0].tokens, stats


__all__ = ["AdaptiveThreshold", "SelfSpeculativeDecoder", "plain_decode"]

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
  q are the filtered distributions of eval/decoding/sampling.py).
- γ is fixed, or adaptive: drafting stops once the draft's top probability falls under
  a threshold that moves after every round toward a target acceptance rate.

The drafts (a skip set, an early exit, an exit adapter) are eval/decoding/drafts.py's.

Batches: the rows draft and verify together, and each keeps its own accepted prefix
and its own next token: the cache is cropped row by row (``KVCache.crop_rows``: the
positions a row did not keep, up to the round's longest row, become holes marked as
padding, which attention and positions skip; nothing moves until the room for them runs
out and the cache is compacted). A row
drafts at most what its own budget allows and draws its random numbers only for its
own drafts, so its tokens and its draws are those it has alone: a prompt's text,
greedy or sampled, does not depend on the batch. The one exception is ``adaptive``:
its stopping rule and threshold are the batch's (drafting stops when the least
confident row's draft does), so with it, sampled text can depend on the batch (greedy
text never does). Rows that end (EOS, a stop string) leave the batch between rounds.
"""

from __future__ import annotations

import time
from typing import Sequence

import torch

from eval.decoding.batch import BatchGenerator, check_prompts, left_padded
from eval.decoding.compiled_step import CompiledStep, decoding_cache
from eval.decoding.drafts import Draft, Forward
from eval.decoding.sampling import Sampling, draw, row_generators, sequence_keys, uniforms
from eval.decoding.static_route import StaticRoute
from eval.decoding.transcripts import Clock, GenerationStats, OnTokens, StopStrings, Transcript, Transcripts
from framework.model.kv_cache import KVCache
from framework.model.decoder import Decoder


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
                 sampling: Sampling | None = None, seed: int = 0, seed_by: str = "prompt",
                 generator: torch.Generator | None = None) -> None:
        draft.check(len(model.blocks))
        sequence_keys([], None, seed_by)  # checks seed_by
        if not (isinstance(gamma, int) and not isinstance(gamma, bool) and gamma >= 1):
            raise ValueError(f"gamma={gamma!r} is invalid: the draft length must be an integer >= 1")
        self.sampling = sampling or Sampling(temperature=temperature)
        self.model, self.draft, self.gamma, self.adaptive, self.seed = model, draft, gamma, adaptive, seed
        self.seed_by = seed_by
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
    def generate_batch(self, prompts: Sequence[Sequence[int]], max_new_tokens: int, *, eos_id: int | Sequence[int] | None = None,
                       stop: StopStrings | None = None, on_tokens: OnTokens | None = None,
                       numbers: Sequence[int] | None = None,
                       generators: list[torch.Generator] | None = None) -> tuple[list[Transcript], GenerationStats]:
        check_prompts(prompts)
        model, num_layers = self.model, len(self.model.blocks)
        clock, stats = Clock(), GenerationStats(sequences=len(prompts))
        book = Transcripts(len(prompts), max_new_tokens, eos_id=eos_id, stop=stop, on_tokens=on_tokens)
        tokens, padding = left_padded(prompts, model.embed.weight.device)
        cache = decoding_cache(model, len(prompts), cache_positions(tokens.shape[1], max_new_tokens, self.gamma,
                                                                   len(prompts)), extra_layers=self.draft.extra_layers)
        generators = generators or row_generators(self.seed, sequence_keys(prompts, numbers, self.seed_by))
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
            budgets = [max_new_tokens - len(book.items[n].tokens) for n in book.running]
            pending = self._round(pending, cache, budgets, book, generators, stats)
        stats.compactions += cache.compactions
        clock.stop(stats)
        return book.items, book.count(stats)

    def _round(self, pending: torch.Tensor, cache: KVCache, budgets: list[int], book: Transcripts,
               generators: list[torch.Generator], stats: GenerationStats) -> torch.Tensor:
        """One draft-and-verify round over the batch; the new pending tokens [B, 1].
        ``budgets``: the tokens each row may still write."""
        start, tick = cache.length, time.perf_counter()
        # the verify pass always adds one token, hence budget - 1 drafts at most
        limits = [min(self.gamma, budget - 1) for budget in budgets]
        drafts, draft_probs = self._draft(pending, cache, limits, generators)
        k = len(drafts)
        limits = [min(limit, k) for limit in limits]  # adaptive drafting may stop before
        inputs = torch.cat([pending] + drafts, dim=1)
        mid = time.perf_counter()
        verified_as = self._verify(inputs, cache, start, k)
        verified = time.perf_counter()
        if self.sampling.greedy:
            accepted, nexts = self._accept_greedy(inputs[:, 1:], verified_as, limits)
        else:
            accepted, nexts = self._accept_sampled(inputs[:, 1:], draft_probs, verified_as, generators, limits)
        cache.crop_rows([start + 1 + count for count in accepted], room=self.gamma + 1)
        # What ran for every row this round: k draft forwards and one verification.
        num_layers = len(self.model.blocks)
        blocks = k * self.draft.layers_run(num_layers) + self.draft.verify_blocks(num_layers, k)
        for row, (row_tokens, count, nxt) in enumerate(zip(inputs[:, 1:].tolist(), accepted, nexts)):
            book.add(row, row_tokens[:count] + [nxt], [blocks / (count + 1)] * (count + 1))
        stats.draft_seconds += mid - tick
        stats.verify_seconds += verified - mid
        stats.bookkeeping_seconds += time.perf_counter() - verified
        stats.rounds += 1
        stats.draft_steps += k
        stats.drafted += sum(limits)
        stats.accepted += sum(accepted)
        if self.adaptive is not None:
            self.adaptive.update(sum(accepted), sum(limits))
        return torch.tensor(nexts, device=inputs.device)[:, None]

    def _draft(self, pending: torch.Tensor, cache: KVCache, limits: list[int], generators: list[torch.Generator]
               ) -> tuple[list[torch.Tensor], list[torch.Tensor | None]]:
        """Up to ``limits[r]`` proposals for row r; a row draws random numbers only for
        the drafts it may use (what it draws alone)."""
        self.draft.begin_round()
        steps = max(limits)
        compiled, forward = self._fusing(steps)
        if compiled is not None:
            return self._fused_draft(compiled, pending, cache, limits, generators)
        drafts, probs, token = [], [], pending
        for step in range(steps):
            logits = self.draft.step(self.model, token, cache, forward)
            drawing = [g if limit > step else None for g, limit in zip(generators, limits)]
            chosen, q = self.sampling.choose(logits, drawing)
            token = chosen[:, None]
            drafts.append(token)
            probs.append(q)
            if self.adaptive is not None:
                top = (q if q is not None else torch.softmax(logits.float(), -1)).max(-1).values
                going = [row for row, limit in enumerate(limits) if limit > step + 1]
                # the batch drafts on while the least sure row that may draft on is sure enough
                if going and self.adaptive.stop(float(top[going].min())):
                    break
        return drafts, probs

    def _fused_draft(self, compiled: CompiledStep, pending: torch.Tensor, cache: KVCache, limits: list[int],
                     generators: list[torch.Generator]) -> tuple[list[torch.Tensor], list[torch.Tensor | None]]:
        """``_draft``'s γ steps, each one's head and its choice, as one compiled graph. Sampling
        draws the round's uniforms first, step by step as the loop would (a row only for the
        drafts it may use), so every row's stream is the one it has uncompiled."""
        draft, model, sampling, steps = self.draft, self.model, self.sampling, max(limits)
        if sampling.greedy:
            def propose(forward, token: torch.Tensor, cache: KVCache) -> list[torch.Tensor]:
                tokens = []
                for _ in range(steps):
                    token = draft.step(model, token, cache, forward).argmax(-1, keepdim=True)
                    tokens.append(token)
                return tokens

            return compiled.fused(("greedy draft", draft, steps), propose, pending, cache), [None] * steps

        u = torch.stack([uniforms([g if limit > step else None for g, limit in zip(generators, limits)],
                                  pending.device) for step in range(steps)], dim=1)

        def propose_sampled(forward, token: torch.Tensor, cache: KVCache, u: torch.Tensor):
            tokens, probs = [], []
            for step in range(steps):
                q = sampling.probabilities(draft.step(model, token, cache, forward))
                token = draw(q, u[:, step])[:, None]
                tokens.append(token)
                probs.append(q)
            return tokens, probs

        return compiled.fused(("sampled draft", draft, sampling, steps), propose_sampled, pending, cache, u)

    def _verify(self, inputs: torch.Tensor, cache: KVCache, start: int, k: int) -> torch.Tensor:
        """The full model on the round's inputs: greedy, its own token at every position
        [B, k + 1]; sampling, its logits [B, k + 1, V]."""
        compiled, forward = self._fusing(k)
        if compiled is None:
            logits = self.draft.verify(self.model, inputs, cache, start, forward)
            return logits.argmax(-1) if self.sampling.greedy else logits
        draft, model, greedy = self.draft, self.model, self.sampling.greedy

        def verify(forward, inputs: torch.Tensor, cache: KVCache, start: int) -> torch.Tensor:
            logits = draft.verify(model, inputs, cache, start, forward)
            return logits.argmax(-1) if greedy else logits

        # the start as a static cache takes it inside a graph (a tensor: an int would specialise the graph)
        return compiled.fused(("greedy verify" if greedy else "verify", draft, k), verify, inputs, cache,
                              cache.at(start))

    def _fusing(self, steps: int) -> tuple[CompiledStep | None, Forward | None]:
        """With compiled steps installed: a round of γ drafts runs as fused graphs (the
        CompiledStep to fuse with); a round cut short (the last of a sequence, its budget
        nearly spent) runs eagerly (the eager forward: compiling its shapes would cost more
        than its one round saves). Otherwise (None, None): ``model.step`` as installed, a
        compiled call per forward for ``adaptive`` (whose rounds stop at any length)."""
        compiled = self.model.__dict__.get("step")
        if not isinstance(compiled, CompiledStep) or self.adaptive is not None:
            return None, None
        return (compiled, None) if steps == self.gamma else (None, compiled.eager)

    @staticmethod
    def _accept_greedy(drafts: torch.Tensor, targets: torch.Tensor, limits: list[int]
                       ) -> tuple[list[int], list[int]]:
        """Per row: accepted draft tokens (at most its limit), and the verifier's token after
        them (``targets`` [B, k + 1]: the full model's greedy token at each position)."""
        if drafts.shape[1] == 0:
            return [0] * targets.shape[0], targets[:, 0].tolist()
        agreed = (drafts == targets[:, :-1]).int().cumprod(1).sum(1)
        accepted = torch.minimum(agreed, torch.tensor(limits, device=agreed.device))
        nexts = targets.gather(1, accepted[:, None])[:, 0]
        return accepted.tolist(), nexts.tolist()

    def _accept_sampled(self, drafts: torch.Tensor, draft_probs: list[torch.Tensor], target_logits: torch.Tensor,
                        generators: list[torch.Generator], limits: list[int]) -> tuple[list[int], list[int]]:
        p = self.sampling.probabilities(target_logits.flatten(0, 1)).view(*target_logits.shape[:2], -1)
        accepted, nexts = [], []
        for row, (generator, limit) in enumerate(zip(generators, limits)):
            count, token = self._accept_row(drafts[row, :limit].tolist(), [q[row] for q in draft_probs[:limit]],
                                            p[row], generator)
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


def cache_positions(prompt_len: int, max_new_tokens: int, gamma: int, rows: int) -> int:
    """Positions a speculative batch's cache holds: the longest prompt, the new tokens, a
    round's γ + 1 beyond the longest row (whose own budget may be spent), and with several
    rows half the new tokens again for the holes that rows keeping fewer tokens than the
    round's longest leave (``KVCache.crop_rows``; compacted when they run out)."""
    return prompt_len + max_new_tokens + gamma + 1 + (max_new_tokens // 2 if rows > 1 else 0)


def plain_decode(model: Decoder, prompt: torch.Tensor | Sequence[int], max_new_tokens: int, *,
                 temperature: float = 0.0, seed: int = 0) -> tuple[list[int], GenerationStats]:
    """Ordinary decoding of one prompt with the full model and a KV cache (no EOS)."""
    generator = BatchGenerator(model, StaticRoute(model), sampling=Sampling(temperature=temperature), seed=seed)
    items, stats = generator.generate([torch.as_tensor(prompt).view(-1).tolist()], max_new_tokens)
    return items[0].tokens, stats


__all__ = ["AdaptiveThreshold", "SelfSpeculativeDecoder", "cache_positions", "plain_decode"]

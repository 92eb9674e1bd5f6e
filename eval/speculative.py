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
  this leaves the full model's distribution p unchanged whatever the draft q is.
- γ is fixed, or adaptive: drafting stops once the draft's top probability falls under
  a threshold that moves after every round toward a target acceptance rate.

The LayerSkip-style draft (early exit at layer E, Elhoushi et al., 2024) is the second
kind: its layers 0..E-1 are the full model's own layers on the same tokens, so their
K/V is already exact, and verification runs layers 0..E-1 on the last draft token only
and layers E..L-1 on all of them, starting from the exit states the draft kept.

`layerdrop speculate run` times plain decoding against self-speculative decoding in
the same process and writes the JSON report (keys fixed in DESIGN.md).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import torch

from framework.kv_cache import KVCache
from framework.model import Decoder


def run_blocks(model: Decoder, h: torch.Tensor, layers: Sequence[int], cache: KVCache) -> torch.Tensor:
    """Run ``layers`` on h, writing K/V at ``cache.length`` (the caller advances it)."""
    bias = model.attention_bias(h.shape[1], cache)
    for index in layers:
        h = model.blocks[index](h, bias, None, cache)
    return h


class SkipDraft:
    """Draft & Verify's draft: the full model with ``skip_layers`` passed through."""

    kind = "skip"

    def __init__(self, skip_layers: Sequence[int]) -> None:
        self.skip_layers = tuple(sorted(set(skip_layers)))

    def check(self, num_layers: int) -> None:
        outside = [i for i in self.skip_layers if not (isinstance(i, int) and 0 <= i < num_layers)]
        if outside:
            raise ValueError(f"skip_layers={list(self.skip_layers)} is invalid: layers must be in "
                             f"0..{num_layers - 1}")

    def layers_run(self, num_layers: int) -> int:
        return num_layers - len(self.skip_layers)

    def begin_round(self) -> None:
        pass

    def step(self, model: Decoder, token: torch.Tensor, cache: KVCache) -> torch.Tensor:
        return model(token, skip_layers=self.skip_layers, cache=cache)[0, -1]

    def verify(self, model: Decoder, inputs: torch.Tensor, cache: KVCache, start: int) -> torch.Tensor:
        cache.crop(start)
        return model(inputs, cache=cache)[0]

    def describe(self) -> dict:
        return {"draft": self.kind, "skip_layers": list(self.skip_layers), "exit_layer": None}


class ExitDraft:
    """LayerSkip-style draft: layers 0..E-1, then the final norm and unembedding."""

    kind = "exit"

    def __init__(self, exit_layer: int) -> None:
        self.exit_layer = exit_layer
        self.states: list[torch.Tensor] = []

    def check(self, num_layers: int) -> None:
        if not (isinstance(self.exit_layer, int) and 1 <= self.exit_layer <= num_layers - 1):
            raise ValueError(f"exit_layer={self.exit_layer!r} is invalid: the draft's exit must be in "
                             f"1..{num_layers - 1} (the model has {num_layers} layers)")

    def layers_run(self, num_layers: int) -> int:
        return self.exit_layer

    def begin_round(self) -> None:
        self.states = []

    def step(self, model: Decoder, token: torch.Tensor, cache: KVCache) -> torch.Tensor:
        h = run_blocks(model, model.embed(token), range(self.exit_layer), cache)
        cache.advance(1)
        self.states.append(h)
        return model.logits(h)[0, -1]

    def verify(self, model: Decoder, inputs: torch.Tensor, cache: KVCache, start: int) -> torch.Tensor:
        # The draft already ran the lower layers on every input but the last one.
        last = run_blocks(model, model.embed(inputs[:, -1:]), range(self.exit_layer), cache)
        cache.crop(start)
        h = run_blocks(model, torch.cat(self.states + [last], dim=1),
                       range(self.exit_layer, len(model.blocks)), cache)
        cache.advance(h.shape[1])
        return model.logits(h)[0]

    def describe(self) -> dict:
        return {"draft": self.kind, "skip_layers": [], "exit_layer": self.exit_layer}


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


@dataclass
class DecodeStats:
    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0

    def add(self, other: "DecodeStats") -> None:
        for name in ("rounds", "drafted", "accepted", "draft_seconds", "verify_seconds"):
            setattr(self, name, getattr(self, name) + getattr(other, name))


def _choose(logits: torch.Tensor, temperature: float, generator: torch.Generator | None
            ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The next token [1, 1], and the distribution it was sampled from (None if greedy)."""
    if temperature == 0.0:
        return logits.argmax(-1).view(1, 1), None
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    return torch.multinomial(probs, 1, generator=generator).view(1, 1), probs


class SelfSpeculativeDecoder:
    """Batch-1 self-speculative decoding with one of the drafts above."""

    def __init__(self, model: Decoder, draft: SkipDraft | ExitDraft, *, gamma: int = 5,
                 adaptive: AdaptiveThreshold | None = None, temperature: float = 0.0,
                 generator: torch.Generator | None = None) -> None:
        draft.check(len(model.blocks))
        if not (isinstance(gamma, int) and gamma >= 1):
            raise ValueError(f"gamma={gamma!r} is invalid: the draft length must be an integer >= 1")
        if temperature < 0:
            raise ValueError(f"temperature={temperature!r} is invalid: must be >= 0 (0 = greedy)")
        self.model, self.draft, self.gamma = model, draft, gamma
        self.adaptive, self.temperature, self.generator = adaptive, temperature, generator

    @torch.inference_mode()
    def generate(self, prompt: torch.Tensor, max_new_tokens: int) -> tuple[list[int], DecodeStats]:
        """``max_new_tokens`` tokens after ``prompt`` [1, P] (or [P])."""
        prompt = prompt.view(1, -1)
        cache = self.model.new_cache(1, prompt.shape[1] + max_new_tokens + 1)
        pending, _ = _choose(self.model(prompt, cache=cache)[0, -1], self.temperature, self.generator)
        out, stats = [pending], DecodeStats()
        produced = 1
        while produced < max_new_tokens:
            new = self._round(pending, cache, max_new_tokens - produced, stats)
            out.extend(new)
            produced += len(new)
            pending = new[-1]
        return torch.cat(out, dim=1)[0, :max_new_tokens].tolist(), stats

    def _round(self, pending: torch.Tensor, cache: KVCache, budget: int, stats: DecodeStats) -> list[torch.Tensor]:
        start, tick = cache.length, time.perf_counter()
        drafts, draft_probs = self._draft(pending, cache, budget)
        inputs = torch.cat([pending] + drafts, dim=1)
        mid = time.perf_counter()
        target_logits = self.draft.verify(self.model, inputs, cache, start)
        if self.temperature == 0.0:
            accepted, nxt = self._accept_greedy(inputs[0, 1:], target_logits)
        else:
            accepted, nxt = self._accept_sampled(inputs[0, 1:], draft_probs, target_logits)
        cache.crop(start + 1 + accepted)
        stats.draft_seconds += mid - tick
        stats.verify_seconds += time.perf_counter() - mid
        stats.rounds += 1
        stats.drafted += len(drafts)
        stats.accepted += accepted
        if self.adaptive is not None:
            self.adaptive.update(accepted, len(drafts))
        return drafts[:accepted] + [nxt]

    def _draft(self, pending: torch.Tensor, cache: KVCache, budget: int
               ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Up to γ proposals; the verify pass always adds one token, hence budget - 1."""
        self.draft.begin_round()
        drafts, probs, token = [], [], pending
        for _ in range(min(self.gamma, budget - 1)):
            logits = self.draft.step(self.model, token, cache)
            token, q = _choose(logits, self.temperature, self.generator)
            drafts.append(token)
            probs.append(q)
            if self.adaptive is not None:
                top = (q if q is not None else torch.softmax(logits.float(), -1)).max()
                if self.adaptive.stop(float(top)):
                    break
        return drafts, probs

    @staticmethod
    def _accept_greedy(drafts: torch.Tensor, target_logits: torch.Tensor) -> tuple[int, torch.Tensor]:
        targets = target_logits.argmax(-1)
        accepted = int((drafts == targets[:-1]).int().cumprod(0).sum()) if drafts.numel() else 0
        return accepted, targets[accepted].view(1, 1)

    def _accept_sampled(self, drafts: torch.Tensor, draft_probs: list[torch.Tensor],
                        target_logits: torch.Tensor) -> tuple[int, torch.Tensor]:
        p = torch.softmax(target_logits.float() / self.temperature, dim=-1)
        uniforms = torch.rand(len(draft_probs), generator=self.generator)
        for i, (token, q) in enumerate(zip(drafts.tolist(), draft_probs)):
            if uniforms[i] * q[token] < p[i, token]:  # u < p/q without dividing by q
                continue
            residual = (p[i] - q).clamp_min(0.0)
            total = residual.sum()
            # total is 0 only when p == q, where a rejection has probability 0.
            dist = residual / total if total > 0 else p[i]
            return i, torch.multinomial(dist, 1, generator=self.generator).view(1, 1)
        k = len(draft_probs)
        return k, torch.multinomial(p[k], 1, generator=self.generator).view(1, 1)


@dataclass
class PlainTimes:
    prefill_seconds: float = 0.0
    step_seconds: float = 0.0
    steps: int = 0


@torch.inference_mode()
def plain_decode(model: Decoder, prompt: torch.Tensor, max_new_tokens: int, *, temperature: float = 0.0,
                 generator: torch.Generator | None = None) -> tuple[list[int], PlainTimes]:
    """Ordinary autoregressive decoding with the full model and a KV cache."""
    prompt = prompt.view(1, -1)
    cache = model.new_cache(1, prompt.shape[1] + max_new_tokens + 1)
    times, tick = PlainTimes(), time.perf_counter()
    token, _ = _choose(model(prompt, cache=cache)[0, -1], temperature, generator)
    times.prefill_seconds = time.perf_counter() - tick
    out = [token]
    tick = time.perf_counter()
    for _ in range(max_new_tokens - 1):
        token, _ = _choose(model(token, cache=cache)[0, -1], temperature, generator)
        out.append(token)
    times.step_seconds, times.steps = time.perf_counter() - tick, max_new_tokens - 1
    return torch.cat(out, dim=1)[0].tolist(), times


# ------------------------------------------------------------------ measurement


def _median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


@dataclass
class Comparison:
    """Plain vs self-speculative decoding of the same prompts, timed in one process."""

    plain_seconds: list[float] = field(default_factory=list)
    spec_seconds: list[float] = field(default_factory=list)
    plain_step_seconds: float = 0.0
    plain_steps: int = 0
    identical: list[bool] = field(default_factory=list)
    stats: DecodeStats = field(default_factory=DecodeStats)
    tokens: int = 0


def compare(model: Decoder, draft: SkipDraft | ExitDraft, prompts: Sequence[torch.Tensor], *,
            max_new_tokens: int = 64, gamma: int = 5, adaptive: AdaptiveThreshold | None = None,
            temperature: float = 0.0, repeats: int = 3, warmup: int = 1, seed: int = 0) -> dict:
    """Time plain decoding and self-speculative decoding on every prompt (median of
    ``repeats`` after ``warmup`` untimed runs each) and return the run report."""
    if not (isinstance(max_new_tokens, int) and max_new_tokens >= 1):
        raise ValueError(f"max_new_tokens={max_new_tokens!r} is invalid: must be an integer >= 1")
    if not prompts:
        raise ValueError("no prompts: give at least one")
    generator = torch.Generator().manual_seed(seed)
    decoder = SelfSpeculativeDecoder(model, draft, gamma=gamma, adaptive=adaptive, temperature=temperature,
                                     generator=generator)
    result = Comparison()
    for prompt in prompts:
        for _ in range(warmup):
            plain_decode(model, prompt, max_new_tokens, temperature=temperature, generator=generator)
            decoder.generate(prompt, max_new_tokens)
        plain_runs, spec_runs = [], []
        for _ in range(repeats):
            tick = time.perf_counter()
            reference, times = plain_decode(model, prompt, max_new_tokens, temperature=temperature,
                                            generator=generator)
            plain_runs.append(time.perf_counter() - tick)
            result.plain_step_seconds += times.step_seconds
            result.plain_steps += times.steps
            tick = time.perf_counter()
            output, stats = decoder.generate(prompt, max_new_tokens)
            spec_runs.append(time.perf_counter() - tick)
            result.stats.add(stats)
            result.identical.append(output == reference)
        result.plain_seconds.append(_median(plain_runs))
        result.spec_seconds.append(_median(spec_runs))
        result.tokens += max_new_tokens
    return _report(model, draft, decoder, result, max_new_tokens=max_new_tokens, repeats=repeats)


def _report(model: Decoder, draft: SkipDraft | ExitDraft, decoder: SelfSpeculativeDecoder, result: Comparison,
            *, max_new_tokens: int, repeats: int) -> dict:
    stats, greedy = result.stats, decoder.temperature == 0.0
    draft_forward = stats.draft_seconds / stats.drafted if stats.drafted else float("nan")
    target_forward = result.plain_step_seconds / result.plain_steps if result.plain_steps else float("nan")
    plain_total, spec_total = sum(result.plain_seconds), sum(result.spec_seconds)
    per_prompt = [p / s for p, s in zip(result.plain_seconds, result.spec_seconds)]
    return {
        **draft.describe(),
        "speedup": plain_total / spec_total,
        "speedup_median_over_prompts": _median(per_prompt),
        "acceptance_rate": stats.accepted / stats.drafted if stats.drafted else float("nan"),
        "draft_time_ratio": draft_forward / target_forward,
        # Sampling draws different tokens than greedy by design: identity does not apply.
        "identical_to_greedy": all(result.identical) if greedy else None,
        "mode": "greedy" if greedy else "sample",
        "temperature": decoder.temperature,
        "gamma": decoder.gamma,
        "adaptive": decoder.adaptive is not None,
        "final_threshold": decoder.adaptive.threshold if decoder.adaptive else None,
        "tokens_per_round": (stats.accepted + stats.rounds) / stats.rounds if stats.rounds else float("nan"),
        "tokens_per_s": result.tokens / spec_total,
        "plain_tokens_per_s": result.tokens / plain_total,
        "t_draft_ms": 1e3 * draft_forward,
        "t_target_ms": 1e3 * target_forward,
        "layers_run_by_draft": draft.layers_run(len(model.blocks)),
        "num_layers": len(model.blocks),
        "prompts": len(result.plain_seconds),
        "max_new_tokens": max_new_tokens,
        "repeats": repeats,
        "threads": torch.get_num_threads(),
    }


# -------------------------------------------------------------------------- CLI


def load_prompts(*, data: str | None = None, prompts_file: str | None = None, count: int = 8,
                 length: int = 32) -> list[torch.Tensor]:
    """Prompts of token ids: the first ``count`` validation sequences of a prepared
    folder cut to ``length`` tokens, or the lists in a JSON file ([[ids...], ...])."""
    if prompts_file is not None:
        rows = json.loads(Path(prompts_file).read_text())
        if not (isinstance(rows, list) and rows and all(isinstance(r, list) and r and
                                                        all(isinstance(t, int) for t in r) for r in rows)):
            raise ValueError(f"--prompts {prompts_file!r} is invalid: expected a JSON list of non-empty "
                             "lists of token ids")
        return [torch.tensor(r, dtype=torch.long) for r in rows[:count]]
    from eval.exits import validation_batches

    out: list[torch.Tensor] = []
    for inputs, _ in validation_batches(str(data), seq_len=length, batch_size=count, max_batches=1):
        out.extend(row.clone() for row in inputs)
        if len(out) >= count:
            break
    if not out:
        raise ValueError(f"--data {data!r} has no validation sequences of {length} tokens")
    return out[:count]


def check_vocabulary(prompts: Sequence[torch.Tensor], vocab_size: int) -> None:
    top = max(int(p.max()) for p in prompts)
    if top >= vocab_size or min(int(p.min()) for p in prompts) < 0:
        raise ValueError(f"prompt token id {top} is invalid for a vocabulary of {vocab_size}")


def add_prompt_arguments(parser: argparse.ArgumentParser, *, count: int | None = 8) -> None:
    """The prompt source; ``count=None`` leaves the number of prompts to the caller."""
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--data", metavar="DIR", help="a folder made by `layerdrop prepare` (validation split)")
    source.add_argument("--prompts", metavar="JSON", help="a JSON file: a list of prompts, each a list of token ids")
    if count is not None:
        parser.add_argument("--num-prompts", type=int, default=count, help=f"prompts to decode (default {count})")
    parser.add_argument("--prompt-len", type=int, default=32, help="prompt tokens, with --data (default 32)")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="tokens generated per prompt (default 64)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="layerdrop speculate run",
                                description="Self-speculative decoding (Draft & Verify) timed against plain "
                                            "decoding in the same process.")
    p.add_argument("--ckpt", required=True, help="a .ckpt from `layerdrop pretrain` or an exported folder")
    draft = p.add_mutually_exclusive_group(required=True)
    draft.add_argument("--skip-layers", metavar="SET",
                       help="the draft skips these layers: i,j,k, a range a-b, alternate-odd/even, or none")
    draft.add_argument("--exit-layer", type=int, metavar="E",
                       help="LayerSkip-style draft: early exit after layer E (1..L-1)")
    p.add_argument("--gamma", type=int, default=5, help="draft tokens per round (the most, if --adaptive; default 5)")
    p.add_argument("--adaptive", action="store_true",
                   help="stop drafting when the draft's top probability < a threshold adapted online")
    p.add_argument("--target-acceptance", type=float, default=0.8, help="with --adaptive (default 0.8)")
    p.add_argument("--threshold", type=float, default=0.5, help="initial threshold with --adaptive (default 0.5)")
    p.add_argument("--temperature", type=float, default=0.0,
                   help="0 = greedy, lossless (default); > 0 samples with the rejection step")
    p.add_argument("--repeats", type=int, default=3, help="timed runs per prompt, median kept (default 3)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed")
    add_prompt_arguments(p)
    p.add_argument("--out", required=True, metavar="JSON", help="report path")
    p.add_argument("--overwrite", action="store_true", help="replace an existing report")
    return p


def build_draft(skip_layers: str | None, exit_layer: int | None, num_layers: int) -> SkipDraft | ExitDraft:
    if exit_layer is not None:
        draft: SkipDraft | ExitDraft = ExitDraft(exit_layer)
    else:
        from eval.skip_sets import parse_skip_set

        draft = SkipDraft(parse_skip_set(skip_layers, num_layers))
    draft.check(num_layers)
    return draft


def check_counts(parser: argparse.ArgumentParser, args: argparse.Namespace, names: Sequence[str]) -> None:
    for name in names:
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name.replace('_', '-')}={value} is invalid: must be an integer >= 1")


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    check_counts(parser, args, ("gamma", "repeats", "num_prompts", "prompt_len", "max_new_tokens", "threads"))
    if Path(args.out).exists() and not args.overwrite:
        parser.error(f"{args.out!r} already exists; pass --overwrite to replace it")
    if args.threads:
        torch.set_num_threads(args.threads)
    from framework.checkpoint import CheckpointError, load_decoder

    try:
        model, cfg = load_decoder(args.ckpt)
        draft = build_draft(args.skip_layers, args.exit_layer, cfg.n_layers)
        adaptive = AdaptiveThreshold(args.target_acceptance, args.threshold) if args.adaptive else None
        prompts = load_prompts(data=args.data, prompts_file=args.prompts, count=args.num_prompts,
                               length=args.prompt_len)
        check_vocabulary(prompts, cfg.vocab_size)
        if args.temperature < 0:
            raise ValueError(f"--temperature={args.temperature} is invalid: must be >= 0 (0 = greedy)")
    except (CheckpointError, FileNotFoundError, ValueError) as err:
        parser.error(str(err))
    report = compare(model, draft, prompts, max_new_tokens=args.max_new_tokens, gamma=args.gamma,
                     adaptive=adaptive, temperature=args.temperature, repeats=args.repeats, seed=args.seed)
    report["ckpt"] = str(args.ckpt)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(f"speedup {report['speedup']:.2f}x  acceptance {report['acceptance_rate']:.2%}  "
          f"T_draft/T_target {report['draft_time_ratio']:.2f}  identical_to_greedy {report['identical_to_greedy']}"
          f"  ({report['tokens_per_s']:.0f} vs {report['plain_tokens_per_s']:.0f} tokens/s); wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

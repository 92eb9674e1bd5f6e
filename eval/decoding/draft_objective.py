"""What a skip-set draft is estimated to gain, without decoding: the objective of the
draft search (eval/decoding/skip_set_search.py, `layerdrop speculate search`).

- acceptance: the full model greedily continues some calibration prompts once; for a
  set S, ONE teacher-forced forward of the draft over those sequences (resumed from the
  full model's stream before S's first block) gives its next-token prediction at every
  position, and the rounds of greedy self-speculative decoding are replayed on that
  trajectory (draft min(γ, left) tokens, accept while the draft agrees, add one token
  from the verifier);
- cost (``DraftCosts``): one draft forward costs c(S) = (t_0 + (L - |S|)/L · (t_L - t_0))
  / t_L of a full one (t_0 the forward without blocks, t_L with all), a verify forward
  over m tokens v(m), m = 1..γ+1 (all measured once, before the search), or by layers
  kept: c = (L - |S|)/L and v = 1;
- estimated speedup = (N - 1) / Σ_rounds (k·c(S) + v(k + 1)), against the N - 1 steps of
  plain decoding after the shared prefill.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Sequence

import torch

from eval.decoding.batch import BatchGenerator, left_padded
from eval.decoding.drafts import SkipDraft
from eval.decoding.skip_set_search import Mask, skip_set
from framework.model.decoder import Decoder


@dataclass
class DraftCosts:
    """Forward times relative to one full single-token decoding step."""

    empty: float  # a forward that runs no block (embedding + head)
    verify: list[float]  # verify[m - 1]: a full forward over m tokens

    def draft(self, layers_run: int, num_layers: int) -> float:
        return self.empty + (1.0 - self.empty) * layers_run / num_layers

    @classmethod
    def from_layers(cls, gamma: int) -> "DraftCosts":
        return cls(empty=0.0, verify=[1.0] * (gamma + 1))

    @classmethod
    @torch.inference_mode()
    def measure(cls, model: Decoder, context: int, gamma: int, repeats: int = 15) -> "DraftCosts":
        """Forward times at ``context`` cached tokens, of the forwards a skip draft runs
        (its ``step`` with no block skipped, with every block skipped; its ``verify`` of
        m tokens): the fastest of ``repeats`` runs, interleaved, so that other processes'
        load disturbs every shape alike."""
        num_layers = len(model.blocks)
        full, empty = SkipDraft(()), SkipDraft(range(num_layers))
        cache = model.new_cache(1, context + gamma + 2)
        full.prefill(model, torch.zeros(1, context, dtype=torch.long), cache, None)
        shapes = [("verify", m) for m in range(1, gamma + 2)] + [("step", "full"), ("step", "empty")]

        def run(shape: tuple) -> None:
            kind, what = shape
            if kind == "verify":
                full.verify(model, torch.zeros(1, what, dtype=torch.long), cache, context)
            else:
                (full if what == "full" else empty).step(model, torch.zeros(1, 1, dtype=torch.long), cache)

        fastest = {shape: math.inf for shape in shapes}
        for repeat in range(repeats + 2):
            for shape in shapes:
                tick = time.perf_counter()
                run(shape)
                if repeat >= 2:  # the first runs warm up the allocator
                    fastest[shape] = min(fastest[shape], time.perf_counter() - tick)
                cache.crop(context)
        step = fastest[("step", "full")]
        return cls(empty=fastest[("step", "empty")] / step,
                   verify=[fastest[("verify", m)] / step for m in range(1, gamma + 2)])


def replay_rounds(agree: Sequence[bool], gamma: int) -> list[tuple[int, int]]:
    """(drafted, accepted) per round of greedy self-speculative decoding of a sequence
    whose token j the draft predicts right iff ``agree[j]`` (token 0 is the prefill's)."""
    rounds, produced, n = [], 1, len(agree)
    while produced < n:
        drafted = min(gamma, n - produced - 1)
        accepted = 0
        while accepted < drafted and agree[produced + accepted]:
            accepted += 1
        rounds.append((drafted, accepted))
        produced += accepted + 1
    return rounds


class CalibrationObjective:
    """Estimated speedup of a skip set from teacher-forced passes over calibration text.
    Prompts may differ in length: the sequences are left-padded, so every continuation
    ends at the right edge."""

    def __init__(self, model: Decoder, prompts: Sequence[torch.Tensor | Sequence[int]], *, new_tokens: int = 64,
                 gamma: int = 5, costs: DraftCosts | None = None) -> None:
        rows = [torch.as_tensor(p).view(-1).tolist() for p in prompts]
        self.model, self.gamma, self.new_tokens = model, gamma, new_tokens
        self.costs = costs or DraftCosts.from_layers(gamma)
        # The trajectory greedy decoding will follow: the full model's own continuation.
        items, _ = BatchGenerator(model).generate(rows, new_tokens)
        self.continuations = torch.tensor([item.tokens for item in items])
        self.sequences, self._padding = left_padded([r + item.tokens for r, item in zip(rows, items)], "cpu")
        self._prefix: list[torch.Tensor] | None = None
        self._inputs_padding: torch.Tensor | None = None
        self._estimates: dict[tuple, dict] = {}

    @torch.inference_mode()
    def agreement(self, skip: Sequence[int] = (), exit_layer: int | None = None) -> torch.Tensor:
        """[prompts, new_tokens] bool: the draft's teacher-forced prediction of each
        continuation token equals it (column 0 comes from the prefill, never drafted).
        The draft skips ``skip``, or exits after ``exit_layer`` (LayerSkip-style)."""
        num_layers = len(self.model.blocks)
        if self._prefix is None:
            # A draft equals the full model up to its first skipped block (or its exit):
            # keep the full model's stream before every block and resume from there.
            inputs, padding = self.sequences[:, :-1], self._padding[:, :-1]
            self._inputs_padding = padding if bool(padding.any()) else None
            embedded = self.model.step(inputs, layers=[]).hidden
            self._prefix = [embedded] + self.model.step(embedded, padding=self._inputs_padding, states=True).states
        if exit_layer is not None:
            self.model.active_layers(exit_layer)  # validates 1..L
            h = self._prefix[exit_layer]
        else:
            first = min(skip, default=num_layers)
            h = self.model.step(self._prefix[first], layers=[i for i in range(first, num_layers) if i not in skip],
                                padding=self._inputs_padding).hidden
        predictions = self.model.logits(h[:, -self.new_tokens:]).argmax(-1)
        return predictions == self.continuations

    def estimate(self, skip: Sequence[int] = (), exit_layer: int | None = None) -> dict:
        """Estimated speedup, acceptance and relative draft cost of one draft."""
        key = (tuple(sorted(set(skip))), exit_layer)
        if key not in self._estimates:
            self._estimates[key] = self._estimate(*key)
        return self._estimates[key]

    def _estimate(self, skip: Sequence[int], exit_layer: int | None) -> dict:
        num_layers = len(self.model.blocks)
        layers_run = exit_layer if exit_layer is not None else num_layers - len(set(skip))
        draft_cost = self.costs.draft(layers_run, num_layers)
        cost = drafted = accepted = 0.0
        steps = 0
        for row in self.agreement(skip, exit_layer).tolist():
            for k, a in replay_rounds(row, self.gamma):
                cost += k * draft_cost + self.costs.verify[k]
                drafted += k
                accepted += a
            steps += len(row) - 1
        return {"speedup": steps / cost if cost else 1.0, "acceptance": accepted / drafted if drafted else 1.0,
                "draft_cost": draft_cost}

    def __call__(self, mask: Mask) -> float:
        return self.estimate(skip_set(mask))["speedup"]


__all__ = ["DraftCosts", "replay_rounds", "CalibrationObjective"]

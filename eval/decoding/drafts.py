"""The drafts of self-speculative decoding: which of the model's own layers propose tokens.

- ``SkipDraft``: Draft & Verify's (Zhang et al., 2024), the full model with a skip set
  S passed through by the residual; verification reruns every layer from the
  pre-draft cache length, overwriting what the draft wrote there.
- ``ExitDraft``: the LayerSkip-style early exit at E (Elhoushi et al., 2024), whose
  layers 0..E-1 are the full model's own on the same tokens, so their K/V is already
  exact: verification runs layers 0..E-1 on the last draft token only and layers
  E..L-1 on all of them, from the exit states the draft kept. ``ExitDraft(E, adapter)``
  reads the exit through a Balcony exit adapter, whose block keeps its own K/V in an
  extra cache slot.

Every forward is one ``Decoder.step``. ``layers_run`` and ``verify_blocks`` count the
blocks a draft forward and a round's verification run per row (per position verified),
what "layers per token" charges.
"""

from __future__ import annotations

from typing import Sequence

import torch

from eval.skip_sets import parse_skip_set
from framework.model.kv_cache import KVCache
from framework.model.decoder import Block, Decoder


class SkipDraft:
    """Draft & Verify's draft: the full model with ``skip_layers`` passed through."""

    kind = "skip"
    extra_layers = 0

    def __init__(self, skip_layers: Sequence[int]) -> None:
        self.skip_layers = tuple(sorted(set(skip_layers)))

    def check(self, num_layers: int) -> None:
        outside = [i for i in self.skip_layers if not (isinstance(i, int) and 0 <= i < num_layers)]
        if outside:
            raise ValueError(f"skip_layers={list(self.skip_layers)} is invalid: layers must be in "
                             f"0..{num_layers - 1}")

    def layers_run(self, num_layers: int) -> int:
        return num_layers - len(self.skip_layers)

    def verify_blocks(self, num_layers: int, drafted: int) -> int:
        """Every layer on the pending token and the ``drafted`` proposals."""
        return num_layers * (drafted + 1)

    def begin_round(self) -> None:
        pass

    def prefill(self, model: Decoder, tokens: torch.Tensor, cache: KVCache, padding: torch.Tensor | None
                ) -> torch.Tensor:
        return model.logits(model.step(tokens, cache, padding=padding).hidden[:, -1])

    def step(self, model: Decoder, token: torch.Tensor, cache: KVCache) -> torch.Tensor:
        layers = model.active_layers(skip_layers=self.skip_layers)
        return model.logits(model.step(token, cache, layers=layers).hidden[:, -1])

    def verify(self, model: Decoder, inputs: torch.Tensor, cache: KVCache, start: int) -> torch.Tensor:
        cache.crop(start)
        return model.logits(model.step(inputs, cache).hidden)

    def describe(self) -> dict:
        return {"draft": self.kind, "skip_layers": list(self.skip_layers), "exit_layer": None}


class ExitDraft:
    """LayerSkip-style draft: layers 0..E-1, then (``adapter``: a Balcony exit adapter's
    block, then) the final norm and unembedding."""

    def __init__(self, exit_layer: int, adapter: Block | None = None) -> None:
        self.exit_layer, self.adapter = exit_layer, adapter
        self.kind = "exit" if adapter is None else "adapter"
        self.states: list[torch.Tensor] = []

    @property
    def extra_layers(self) -> int:
        return 0 if self.adapter is None else self.adapter.attn.layer_index + 1 - self._num_layers

    def check(self, num_layers: int) -> None:
        self._num_layers = num_layers
        if not (isinstance(self.exit_layer, int) and 1 <= self.exit_layer <= num_layers - 1):
            raise ValueError(f"exit_layer={self.exit_layer!r} is invalid: the draft's exit must be in "
                             f"1..{num_layers - 1} (the model has {num_layers} layers)")

    def layers_run(self, num_layers: int) -> int:
        return self.exit_layer + (self.adapter is not None)

    def verify_blocks(self, num_layers: int, drafted: int) -> int:
        """Layers 0..E-1 (and the adapter) on the last input only, E..L-1 on all of them."""
        return self.layers_run(num_layers) + (num_layers - self.exit_layer) * (drafted + 1)

    def begin_round(self) -> None:
        self.states = []

    def prefill(self, model: Decoder, tokens: torch.Tensor, cache: KVCache, padding: torch.Tensor | None
                ) -> torch.Tensor:
        """The full model on the prompt (and the adapter's K/V of it at its exit)."""
        exits = {} if self.adapter is None else {self.exit_layer: self.adapter}
        return model.logits(model.step(tokens, cache, padding=padding, exits=exits).hidden[:, -1])

    def _lower(self, model: Decoder, tokens: torch.Tensor, cache: KVCache):
        """Layers 0..E-1 (and the adapter) on ``tokens`` at the cache's length."""
        return model.step(tokens, cache, layers=range(self.exit_layer), exits={self.exit_layer: self.adapter})

    def step(self, model: Decoder, token: torch.Tensor, cache: KVCache) -> torch.Tensor:
        out = self._lower(model, token, cache)
        self.states.append(out.hidden)
        return model.logits(out.reads[self.exit_layer][:, -1])

    def verify(self, model: Decoder, inputs: torch.Tensor, cache: KVCache, start: int) -> torch.Tensor:
        # The draft already ran the lower layers on every input but the last one.
        last = self._lower(model, inputs[:, -1:], cache).hidden
        cache.crop(start)  # the upper layers write every position from ``start`` again
        upper = model.step(torch.cat(self.states + [last], dim=1), cache,
                           layers=range(self.exit_layer, len(model.blocks)))
        return model.logits(upper.hidden)

    def describe(self) -> dict:
        return {"draft": self.kind, "skip_layers": [], "exit_layer": self.exit_layer}


def default_draft_exit(num_layers: int, adapter_exits: Sequence[int] = ()) -> int:
    """The draft when none is given: an early exit at E = round(L/3) (at least 1) —
    LayerSkip's kind, whose K/V is the full model's own; with adapters, the adapter
    exit nearest to L/3."""
    target = max(1, min(num_layers - 1, round(num_layers / 3)))
    if adapter_exits:
        return min(adapter_exits, key=lambda e: (abs(e - target), e))
    return target


Draft = SkipDraft | ExitDraft


def make_draft(spec: str | None, num_layers: int, adapters=None) -> Draft:
    """A draft from ``exit:E``, ``skip:SET`` or ``adapter:E`` (None: the default, see
    ``default_draft_exit``; through an adapter when ``adapters`` are given)."""
    if spec is None:
        exits = list(adapters.exits) if adapters is not None else []
        exit_layer = default_draft_exit(num_layers, exits)
        draft: Draft = ExitDraft(exit_layer, adapters.blocks[str(exit_layer)] if exits else None)
    else:
        kind, _, value = spec.partition(":")
        if kind == "skip" and value:
            draft = SkipDraft(parse_skip_set(value, num_layers))
        elif kind in ("exit", "adapter") and value.strip().isdigit():
            exit_layer = int(value)
            if kind == "adapter":
                if adapters is None:
                    raise ValueError(f"draft {spec!r} needs --adapters DIR (trained by `layerdrop adapters fit`)")
                if exit_layer not in adapters.exits:
                    raise ValueError(f"draft {spec!r} is invalid: the adapters have exits {adapters.exits}")
            draft = ExitDraft(exit_layer, adapters.blocks[str(exit_layer)] if kind == "adapter" else None)
        else:
            raise ValueError(f"draft {spec!r} is invalid: allowed: exit:E (E in 1..{num_layers - 1}), skip:SET "
                             f"(block indices in 0..{num_layers - 1}), adapter:E (with --adapters)")
    draft.check(num_layers)
    return draft


__all__ = ["SkipDraft", "ExitDraft", "Draft", "default_draft_exit", "make_draft"]

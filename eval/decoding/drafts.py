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

Every forward is one ``Decoder.step`` (``forward``: the one to call instead of
``model.step``, e.g. the eager step inside a compiled loop of draft steps).
``layers_run`` and ``verify_blocks`` count the blocks a draft forward and a round's
verification run per row (per position verified), what "layers per token" charges.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from eval.skip_sets import parse_skip_set
from framework.model.kv_cache import KVCache
from framework.model.decoder import Block, Decoder, StepOutput

Forward = Callable[..., StepOutput]  # Decoder.step's signature


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

    def step(self, model: Decoder, token: torch.Tensor, cache: KVCache, forward: Forward | None = None
             ) -> torch.Tensor:
        layers = model.active_layers(skip_layers=self.skip_layers)
        return model.logits((forward or model.step)(token, cache, layers=layers).hidden[:, -1])

    def verify(self, model: Decoder, inputs: torch.Tensor, cache: KVCache, start: int,
               forward: Forward | None = None) -> torch.Tensor:
        cache.crop(start)
        return model.logits((forward or model.step)(inputs, cache).hidden)

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

    def _lower(self, model: Decoder, tokens: torch.Tensor, cache: KVCache, forward: Forward | None = None):
        """Layers 0..E-1 (and the adapter) on ``tokens`` at the cache's length."""
        return (forward or model.step)(tokens, cache, layers=range(self.exit_layer),
                                       exits={self.exit_layer: self.adapter})

    def step(self, model: Decoder, token: torch.Tensor, cache: KVCache, forward: Forward | None = None
             ) -> torch.Tensor:
        out = self._lower(model, token, cache, forward)
        self.states.append(out.hidden)
        return model.logits(out.reads[self.exit_layer][:, -1])

    def verify(self, model: Decoder, inputs: torch.Tensor, cache: KVCache, start: int,
               forward: Forward | None = None) -> torch.Tensor:
        # The draft already ran the lower layers on every input but the last one.
        last = self._lower(model, inputs[:, -1:], cache, forward).hidden
        cache.crop(start)  # the upper layers write every position from ``start`` again
        upper = (forward or model.step)(torch.cat(self.states + [last], dim=1), cache,
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


def searched_draft(report_path: str | Path, num_layers: int) -> tuple[str, int]:
    """(draft spec, γ) of the fastest lossless draft a `speculate search` report measured:
    its best skip set or its best exit draft, whichever decoded faster on the search's
    confirmation prompts (the two were timed on the same prompts, in the same process).
    ValueError (one line) for a file that is not such a report of a ``num_layers`` model."""
    from framework.checkpoint.hf.draft import check_searched_depth, read_search_report

    report, where = read_search_report(report_path, ValueError)
    if not isinstance(report, dict) or not isinstance(report.get("best"), dict):
        raise ValueError(f"{where} has no best draft: not a report of `layerdrop speculate search`")
    check_searched_depth(report, num_layers, where, ValueError)
    gamma = report.get("gamma")
    if not isinstance(gamma, int) or isinstance(gamma, bool) or gamma < 1:
        raise ValueError(f"{where}: gamma={gamma!r} is invalid: draft tokens per round, an integer >= 1")
    candidates = [(_searched_spec(entry, num_layers, where), entry["speedup"])
                  for entry in (report["best"], report.get("best_exit"))
                  if isinstance(entry, dict) and entry.get("identical_to_greedy") is True
                  and isinstance(entry.get("speedup"), (int, float))]
    if not candidates:
        raise ValueError(f"{where}: no draft of the search was lossless when measured (identical_to_greedy "
                         "is not true for its best skip set nor its best exit)")
    return max(candidates, key=lambda c: c[1])[0], gamma


def _searched_spec(entry: dict[str, Any], num_layers: int, where: str) -> str:
    exit_layer, skip = entry.get("exit_layer"), entry.get("skip_layers")
    if exit_layer is not None:
        if not isinstance(exit_layer, int) or isinstance(exit_layer, bool) or not 1 <= exit_layer < num_layers:
            raise ValueError(f"{where}: exit_layer={exit_layer!r} is invalid: an exit in 1..{num_layers - 1}")
        return f"exit:{exit_layer}"
    if not isinstance(skip, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in skip):
        raise ValueError(f"{where}: skip_layers={skip!r} is invalid: a list of block indices")
    return "skip:" + (",".join(map(str, skip)) if skip else "none")


__all__ = ["SkipDraft", "ExitDraft", "Draft", "default_draft_exit", "make_draft", "searched_draft"]

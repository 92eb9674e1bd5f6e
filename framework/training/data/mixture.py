"""A weighted mixture of prepared folders (``data.mixture``), checked whole before a step.

    data:
      mixture:
        code:  {dir: data/code,  weight: 0.3}
        prose: {dir: data/prose, weight: 0.7}

      mixture_schedule:                  # optional: other weights from a step on (an anneal)
        - {from_step: 900, weights: {code: 0.1, prose: 0.9}}

Training draws every sequence's source at random with the weights (mixture_loader.py);
validation scores each source's own val split and the weighted total. The sources must
speak one token language: the same tokenizer (its sha256 in each manifest) and the same
document convention (EOS and BOS ids, BOS first or not). Weights that change are a new
*phase* (a final anneal on a better mix, as OLMo 2 and Llama 3 do): a run resumed with
other weights, or a step of ``mixture_schedule``; ``MixturePhases`` records each phase's
weights and steps.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import asdict, dataclass
from typing import Any, Mapping

from framework.files.staging import is_url

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
KEYS = ("dir", "weight")


@dataclass(frozen=True)
class Source:
    """One prepared folder of a mixture; ``weight`` is its share (the shares sum to 1)."""

    name: str
    dir: str
    weight: float


def parse_mixture(mixture: Any) -> list[Source]:
    """``{name: {dir, weight}}`` -> sources with shares summing to 1, or a one-line
    ValueError naming the bad entry and what is allowed."""
    if not isinstance(mixture, Mapping) or not mixture:
        raise ValueError(f"data.mixture={mixture!r} is invalid: give a mapping of source name -> "
                         "{dir: PREPARED_FOLDER, weight: W}, at least one source")
    raw = [_source(name, entry) for name, entry in mixture.items()]
    total = sum(weight for _, _, weight in raw)  # not fsum: it raises on overflow instead of giving inf
    if not math.isfinite(total) or total <= 0:
        raise ValueError(f"data.mixture weights sum to {total}: they must sum to a positive, finite number")
    _refuse_duplicates(raw)
    return [Source(name, folder, weight / total) for name, folder, weight in raw]


def _source(name: Any, entry: Any) -> tuple[str, str, float]:
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise ValueError(f"data.mixture source name {name!r} is invalid: use letters, digits, '_', '.', '-' "
                         "(it names the source's metrics, e.g. val/loss/<name>)")
    if not isinstance(entry, Mapping) or set(entry) != set(KEYS):
        raise ValueError(f"data.mixture.{name}={entry!r} is invalid: give exactly {{dir: FOLDER, weight: W}}")
    folder, weight = entry["dir"], entry["weight"]
    if not isinstance(folder, str) or not folder.strip():
        raise ValueError(f"data.mixture.{name}.dir={folder!r} is invalid: give a prepared folder (path or URL)")
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight) or weight <= 0:
        raise ValueError(f"data.mixture.{name}.weight={weight!r} is invalid: it must be a finite number > 0")
    return name, folder.rstrip("/") or folder, float(weight)


def _refuse_duplicates(raw: list[tuple[str, str, float]]) -> None:
    seen: dict[str, str] = {}
    for name, folder, _ in raw:
        key = folder if is_url(folder) else os.path.realpath(folder)
        if key in seen:
            raise ValueError(f"data.mixture.{name}.dir={folder!r} is invalid: source {seen[key]!r} reads the same "
                             "folder; give each folder once (its weight is its share)")
        seen[key] = name


CONVENTION = ("sha256", "eos_id", "bos_id", "document_start")


def check_same_language(sources: list[Source], manifests: list[dict]) -> None:
    """Refuse sources prepared with different tokenizers or document conventions: a token
    id must mean the same thing whichever source it came from."""
    first, reference = sources[0], manifests[0]["tokenizer"]
    for source, manifest in zip(sources[1:], manifests[1:]):
        tokenizer = manifest["tokenizer"]
        for key in CONVENTION:
            if tokenizer.get(key) != reference.get(key):
                what = "tokenizer (sha256 of tokenizer.json)" if key == "sha256" else f"tokenizer.{key}"
                raise ValueError(f"data.mixture.{source.name} ({source.dir}) was prepared with another {what} than "
                                 f"{first.name} ({first.dir}): {tokenizer.get(key)!r} vs {reference.get(key)!r}; "
                                 f"prepare every source with one tokenizer (`layerdrop prepare --tokenizer "
                                 f"{first.dir}/{reference.get('file', 'tokenizer.json')}`)")


def parse_schedule(schedule: Any, sources: list[Source]) -> list[tuple[int, list[Source]]]:
    """``data.mixture_schedule``: ``[{from_step: S, weights: {name: W, ...}}, ...]``, steps
    increasing, every source named -> [(from_step, the sources with those shares)], the
    mixture's own weights from step 0. A one-line ValueError for a bad entry."""
    if not isinstance(schedule, (list, tuple)) or not schedule:
        raise ValueError(f"data.mixture_schedule={schedule!r} is invalid: give a list of "
                         "{from_step: STEP, weights: {source: W, ...}}, at least one")
    phases, last = [(0, sources)], 0
    names = [source.name for source in sources]
    for index, entry in enumerate(schedule):
        where = f"data.mixture_schedule[{index}]"
        if not isinstance(entry, Mapping) or set(entry) != {"from_step", "weights"}:
            raise ValueError(f"{where}={entry!r} is invalid: give exactly {{from_step: STEP, weights: {{...}}}}")
        step, weights = entry["from_step"], entry["weights"]
        if isinstance(step, bool) or not isinstance(step, int) or step <= last:
            raise ValueError(f"{where}.from_step={step!r} is invalid: steps must be integers, increasing, > {last}")
        if not isinstance(weights, Mapping) or sorted(weights) != sorted(names):
            raise ValueError(f"{where}.weights={weights!r} is invalid: give a weight for each source of "
                             f"data.mixture ({', '.join(names)}) and no other")
        shares = parse_mixture({source.name: {"dir": source.dir, "weight": weights[source.name]} for source in sources})
        phases.append((step, shares))
        last = step
    return phases


class MixturePhases:
    """The weights a run trained with, as phases ``{weights, start_step, end_step}``;
    a resume with other weights closes the last phase and opens one at the resumed step."""

    def __init__(self, phases: list[dict] | None = None) -> None:
        self.phases = [dict(phase) for phase in phases or []]

    def begin(self, sources: list[Source], step: int) -> str | None:
        """Enter the phase of these weights at ``step``; a line to print when they changed."""
        weights = {source.name: source.weight for source in sources}
        if self.phases and self.phases[-1]["weights"] == weights:
            return None
        note = None
        if self.phases:
            before = self.phases[-1]["weights"]
            self.phases[-1]["end_step"] = step
            names = list(dict.fromkeys([*before, *weights]))
            change = ", ".join(f"{name} {before.get(name, 0):.3f} -> {weights.get(name, 0):.3f}" for name in names)
            note = f"data mixture: new weights from step {step} (phase {len(self.phases) + 1}): {change}"
        self.phases.append({"weights": weights, "start_step": step, "end_step": None})
        return note

    def state(self) -> list[dict]:
        return [dict(phase) for phase in self.phases]


def describe(sources: list[Source]) -> list[dict]:
    return [asdict(source) for source in sources]


__all__ = ["Source", "parse_mixture", "parse_schedule", "check_same_language", "MixturePhases", "describe"]

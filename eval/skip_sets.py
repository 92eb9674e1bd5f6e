"""Named layer-skip sets and the sweeps that order them by parameters kept.

A skip set is the sorted tuple of block indices (0..L-1) removed at inference; the
residual stream passes through them. Specs a user can write:

    none            the full model (nothing skipped)
    alternate-odd   1, 3, 5, ...   (the layers the alternating distribution, ALD, drops)
    alternate-even  0, 2, 4, ...
    a-b             the contiguous range a..b, both ends included ("4-7")
    i,j,k           an explicit list ("1,4,9"; ';' or '+' also separate, for lm-eval
                    model-argument strings where ',' is taken)

Sweep families generate many sets at once:

    alternate   alternate-odd and alternate-even
    single      every single layer {i}
    middle      for k = 1..L-2, the k middle layers (first and last block kept): the
                loss-vs-memory curve of the paper's Figs 6 and A.3
    contiguous  every range a-b shorter than L (L(L+1)/2 - 1 sets: use on small L)

Results are reported against the parameters kept (the paper's memory-footprint axis):
every parameter of the model minus those of the skipped blocks.
"""

from __future__ import annotations

import re
from typing import Iterable, Sequence

import torch.nn as nn

NAMED_SETS = ("none", "alternate-odd", "alternate-even")
SWEEPS = ("alternate", "single", "middle", "contiguous")
_RANGE = re.compile(r"^(\d+)-(\d+)$")
_LIST = re.compile(r"^\d+([,;+\s]+\d+)*$")


def parse_skip_set(spec: str | Iterable[int], num_layers: int) -> tuple[int, ...]:
    """The sorted skip set a spec names, validated against a model of ``num_layers``."""
    if not isinstance(spec, str):
        return _checked(spec, num_layers, repr(list(spec)))
    text = spec.strip()
    if text == "none" or text == "":
        return ()
    if text == "alternate-odd":
        return tuple(range(1, num_layers, 2))
    if text == "alternate-even":
        return tuple(range(0, num_layers, 2))
    match = _RANGE.match(text)
    if match:
        start, end = int(match.group(1)), int(match.group(2))
        if start > end:
            raise ValueError(f"skip set {spec!r} is invalid: a range a-b needs a <= b")
        return _checked(range(start, end + 1), num_layers, spec)
    if _LIST.match(text):
        return _checked((int(x) for x in re.split(r"[,;+\s]+", text)), num_layers, spec)
    raise ValueError(f"skip set {spec!r} is invalid: allowed: {', '.join(NAMED_SETS)}, "
                     "a range a-b, or a list of layer indices like 1,4,9")


def _checked(layers: Iterable[int], num_layers: int, spec: str) -> tuple[int, ...]:
    layers = list(layers)
    bad = [i for i in layers if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < num_layers]
    if bad:
        raise ValueError(f"skip set {spec!r} is invalid: layers {bad} are outside 0..{num_layers - 1} "
                         f"(the model has {num_layers} layers)")
    if len(set(layers)) == num_layers:
        raise ValueError(f"skip set {spec!r} is invalid: it skips all {num_layers} layers")
    return tuple(sorted(set(layers)))


def sweep_sets(family: str, num_layers: int) -> list[tuple[int, ...]]:
    """Every skip set of a sweep family (see the module docstring)."""
    n = num_layers
    if family == "alternate":
        sets = [tuple(range(1, n, 2)), tuple(range(0, n, 2))]
    elif family == "single":
        sets = [(i,) for i in range(n)] if n > 1 else []
    elif family == "middle":
        sets = [tuple(range(1 + (n - 2 - k) // 2, 1 + (n - 2 - k) // 2 + k)) for k in range(1, n - 1)]
    elif family == "contiguous":
        sets = [tuple(range(a, b + 1)) for a in range(n) for b in range(a, n) if b - a + 1 < n]
    else:
        raise ValueError(f"sweep {family!r} is invalid: allowed: {', '.join(SWEEPS)}")
    return [s for s in sets if s and len(s) < n]


def resolve_sets(specs: Sequence[str], sweeps: Sequence[str], num_layers: int) -> list[tuple[int, ...]]:
    """The union of explicit specs and sweep families, first occurrence kept, in order."""
    seen: dict[tuple[int, ...], None] = {}
    for spec in specs:
        seen.setdefault(parse_skip_set(spec, num_layers), None)
    for family in sweeps:
        for skip in sweep_sets(family, num_layers):
            seen.setdefault(skip, None)
    return list(seen)


def block_parameters(decoder: nn.Module) -> list[int]:
    """Parameters of each block, in layer order."""
    return [sum(p.numel() for p in block.parameters()) for block in decoder.blocks]


def params_kept(decoder: nn.Module, skip: Sequence[int]) -> int:
    """All parameters (embedding and head included: the memory footprint) minus the
    skipped blocks'."""
    per_block = block_parameters(decoder)
    total = sum(p.numel() for p in decoder.parameters())
    return total - sum(per_block[i] for i in skip)


def order_by_params_kept(results: list[dict]) -> list[dict]:
    """Most parameters kept first; ties by fewer layers skipped, then by the set."""
    return sorted(results, key=lambda r: (-r["params_kept"], len(r["skip_layers"]), r["skip_layers"]))


def describe(skip: Sequence[int], num_layers: int) -> str:
    """A short name for plots and tables: the named set it equals, a range, or a list."""
    skip = tuple(skip)
    named = {tuple(range(1, num_layers, 2)): "alternate-odd",
             tuple(range(0, num_layers, 2)): "alternate-even", (): "none"}
    if skip in named:
        return named[skip]
    if len(skip) > 1 and skip == tuple(range(skip[0], skip[-1] + 1)):
        return f"{skip[0]}-{skip[-1]}"
    return ",".join(map(str, skip))


__all__ = [
    "NAMED_SETS",
    "SWEEPS",
    "parse_skip_set",
    "sweep_sets",
    "resolve_sets",
    "block_parameters",
    "params_kept",
    "order_by_params_kept",
    "describe",
]

"""The decoding modes: one registry for `layerdrop generate`, the lm-eval model and the benchmarks.

A mode is named by a spec: its name, then ``:VALUE`` where it takes one (``full``,
``exit:3``, ``skip:1,3``, ``speculative``, ``dynamic``). Each mode is one module of
this package that defines ``MODE``, a ``Mode``: its syntax and help line, the settings
it reads, how it checks its value against the model's depth, and how it builds a
decoder (a ``generate(prompts, max_new_tokens, **kw)`` callable: ``BatchGenerator``'s
or ``SelfSpeculativeDecoder.generate_batch``). The package finds its modules by
listing itself: adding a mode = one module here + its test.

A setting given to a mode that does not read it is refused (``refuse_unread``): no
option is silently ignored.
"""

from __future__ import annotations

import importlib
import pkgutil
import textwrap
from dataclasses import dataclass, field, fields
from functools import lru_cache
from typing import Any, Callable, Sequence

from eval.decoding.sampling import Sampling
from framework.model.decoder import Decoder

Decode = Callable[..., Any]  # generate(prompts, max_new_tokens, *, eos_id, stop, on_tokens, numbers) -> (items, stats)


@dataclass(frozen=True)
class Settings:
    """What a mode may read besides its spec. ``None``/``False``: not given (the mode's
    default applies); ``sampling`` and ``seed`` apply to every mode."""

    sampling: Sampling = field(default_factory=Sampling)
    seed: int = 0
    seed_by: str = "prompt"  # what each sequence's sampling stream is seeded from (eval/decoding/sampling.py)
    adapters: Any = None  # eval.adapters.ExitAdapters, loaded on the model
    draft: str | None = None
    gamma: int | None = None
    adaptive: bool = False
    threshold: float | None = None
    exits: str | Sequence[int] | None = None


COMMON = ("sampling", "seed", "seed_by")


@dataclass(frozen=True)
class Mode:
    name: str  # the spec's part before ':'
    syntax: str  # as a user writes it: "exit:K"
    help: str  # one line for --help
    build: Callable[[Decoder, Any, Settings], Decode]
    parse: Callable[[str, str, int], Any] | None = None  # (value, spec, num_layers) -> value; None: takes none
    reads: tuple[str, ...] = ()  # the Settings fields it uses besides COMMON
    order: int = 50  # place in listings (full first)


@lru_cache(maxsize=None)
def modes() -> dict[str, Mode]:
    """Every mode of this package, by name, in listing order."""
    found = []
    for info in pkgutil.iter_modules(__path__):
        mode = importlib.import_module(f"{__name__}.{info.name}").MODE
        found.append(mode)
    return {m.name: m for m in sorted(found, key=lambda m: (m.order, m.name))}


def allowed() -> str:
    return ", ".join(m.syntax for m in modes().values())


def parse(spec: str, num_layers: int) -> tuple[Mode, Any]:
    """(the mode, its checked value) of ``spec`` for a model of ``num_layers`` blocks."""
    name, colon, value = str(spec).partition(":")
    mode = modes().get(name)
    if mode is None or (mode.parse is None) == bool(colon) or (colon and not value.strip()):
        raise ValueError(f"--mode {spec!r} is invalid: allowed: {allowed()} (e.g. exit:2, skip:1,3)")
    return mode, (mode.parse(value, spec, num_layers) if mode.parse is not None else None)


def refuse_unread(mode: Mode, settings: Settings, spec: str) -> None:
    """A ValueError naming the first setting given that ``mode`` (of ``spec``) does not read."""
    for item in fields(Settings):
        value = getattr(settings, item.name)
        if item.name in COMMON or item.name in mode.reads or value is None or value is False:
            continue
        readers = [m.syntax for m in modes().values() if item.name in m.reads]
        raise ValueError(f"--{item.name} is for --mode {' or '.join(readers)} only (the mode given is {spec!r})")


def decoder(spec: str, model: Decoder, settings: Settings = Settings()) -> Decode:
    """The decoder of ``spec`` on ``model`` (settings checked: none unread)."""
    mode, value = parse(spec, len(model.blocks))
    refuse_unread(mode, settings, spec)
    return mode.build(model, value, settings)


def help_lines(width: int = 16) -> str:
    """The modes as `layerdrop generate --help` lists them."""
    indent = " " * (4 + width)
    return "\n".join(textwrap.fill(m.help, 88, initial_indent=f"    {m.syntax:<{width}}", subsequent_indent=indent)
                     for m in modes().values())


__all__ = ["Settings", "Mode", "Decode", "modes", "allowed", "parse", "refuse_unread", "decoder", "help_lines"]

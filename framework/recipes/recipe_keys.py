"""The dotted keys a recipe may set, read from `layerdrop pretrain`'s own parser.

    keys = recipe_keys()
    keys.problem("trainer.max_stepz")   # "'trainer.max_stepz' is not a recipe key (did you mean 'trainer.max_steps'?)"
    keys.first_unknown({"model.lr_schedule": {"warmup_steps": 0}, "data.batch_sise": 8})   # "data.batch_sise"

A tool that writes recipes for many runs (`layerdrop sweep`, `layerdrop tune`) checks
its keys here once, in-process, instead of learning of a typo from a `pretrain
--print_config` per run after the run folders exist. The set is the parser's, so it
follows the code: a new field of ModelConfig or a new Trainer argument is a key the
moment `pretrain` accepts it. Below a key whose value may be a mapping (a dict such as
``data.storage_options``, or a class Lightning builds from ``class_path`` and
``init_args`` such as ``trainer.strategy``) any key is the value's own, not checked here.
"""

from __future__ import annotations

import argparse
import collections.abc
import datetime
import difflib
import functools
import os
import types
import typing
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from framework.recipes.parser_cache import cached

if TYPE_CHECKING:  # the parser needs Lightning, which the cached keys do not
    from lightning.pytorch.cli import LightningArgumentParser


@dataclass(frozen=True)
class RecipeKeys:
    leaves: frozenset[str]  # keys that hold one value (trainer.max_steps)
    sections: frozenset[str]  # keys that hold keys (model, model.decoder)
    open: frozenset[str]  # leaves whose value may be a mapping: any key below one is its value's

    def problem(self, key: str) -> str | None:
        """None for a key a recipe may set, else one line naming it and the nearest key."""
        parts = key.split(".")
        if key in self.leaves or key in self.sections \
                or any(".".join(parts[:size]) in self.open for size in range(1, len(parts))):
            return None
        nearest = difflib.get_close_matches(key, sorted(self.leaves | self.sections), n=1, cutoff=0.6)
        hint = f"did you mean {nearest[0]!r}?" if nearest else "see layerdrop pretrain --help"
        return f"{key!r} is not a recipe key ({hint})"

    def first_unknown(self, settings: dict[str, Any], prefix: str = "") -> str | None:
        """The first key of ``settings`` (dotted key -> value) that is not a recipe key; a
        section given a mapping (``model.lr_schedule: {warmup_steps: 0}``) has its keys
        checked too."""
        for key, value in settings.items():
            key = f"{prefix}{key}"
            if self.problem(key) is not None:
                return key
            if key in self.sections and isinstance(value, dict):
                inner = self.first_unknown(value, f"{key}.")
                if inner is not None:
                    return inner
        return None


@functools.cache
def recipe_keys() -> RecipeKeys:
    """The keys of `layerdrop pretrain`'s parser: built once per version of the code
    (framework/recipes/parser_cache.py), so a typo is found without importing Lightning."""
    def build() -> str:
        keys = keys_of(pretrain_parser())
        return json.dumps({name: sorted(getattr(keys, name)) for name in ("leaves", "sections", "open")})

    saved = json.loads(cached("recipe_keys.json", build))
    return RecipeKeys(**{name: frozenset(values) for name, values in saved.items()})


def keys_of(parser: LightningArgumentParser) -> RecipeKeys:
    # jsonargparse gives every value-holding argument a type hint; the help actions of
    # class arguments (trainer.strategy.help) and link targets (data.model_vocab_size,
    # set from model.decoder.vocab_size) hold none a recipe can set.
    hints = {action.dest: action._typehint for action in parser._actions
             if hasattr(action, "_typehint") and action.default is not argparse.SUPPRESS}
    sections = {".".join(key.split(".")[:size]) for key in hints for size in range(1, key.count(".") + 1)}
    return RecipeKeys(leaves=frozenset(hints), sections=frozenset(sections),
                      open=frozenset(key for key, hint in hints.items() if holds_mapping(hint)))


# Classes whose values are plain (not built from class_path and init_args).
_PLAIN = (int, float, str, bytes, type(None), os.PathLike, datetime.timedelta)


def holds_mapping(hint: Any) -> bool:
    """Whether a value of type ``hint`` may be a mapping: a dict, or a class jsonargparse
    builds from ``{class_path, init_args}`` (a Strategy, a Logger, a Callback)."""
    if hint is Any or hint is dict:
        return True
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return any(holds_mapping(arg) for arg in typing.get_args(hint))
    if origin is not None:  # list[...], tuple[...], Literal[...], Iterable[...]: not a mapping of keys
        return origin in (dict, collections.abc.Mapping)
    return isinstance(hint, type) and not issubclass(hint, _PLAIN)


def _parser_only_cli() -> type:
    """A PretrainCLI that stops once its parser is built (Lightning is imported here)."""
    from framework.training.pretrain import PretrainCLI

    class _ParserOnly(PretrainCLI):
        def parse_arguments(self, parser: LightningArgumentParser, args: Any) -> None:
            raise _ParserBuilt(parser)

    return _ParserOnly


class _ParserBuilt(Exception):
    """Carries the parser out of LightningCLI's constructor, which goes on to parse
    arguments and build the model, the data and the Trainer (there is no public way to
    stop it earlier)."""

    def __init__(self, parser: LightningArgumentParser) -> None:
        super().__init__("parser built")
        self.parser = parser


def pretrain_parser() -> LightningArgumentParser:
    """The parser `layerdrop pretrain` parses a recipe with (nothing parsed, nothing built)."""
    from framework.training.pretrain import build_cli

    try:
        build_cli([], cli_class=_parser_only_cli())
    except _ParserBuilt as built:
        return built.parser
    raise AssertionError("PretrainCLI parsed its arguments without building a parser first")


__all__ = ["RecipeKeys", "recipe_keys", "keys_of", "holds_mapping", "pretrain_parser"]

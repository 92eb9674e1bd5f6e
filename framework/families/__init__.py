"""Model families: one folder each under framework/families/, found by looking.

    framework/families/<name>/
        rules.py    ARGS: the family's own config fields (a frozen dataclass, e.g.
                    framework/families/llama/args.py; None when it has none) and check(cfg),
                    its config rules; imports nothing of the project, since
                    framework/config.py reads it while it is itself being imported
        blocks.py   its Decoder subclass and the parts of its blocks (with their FLOP and
                    activation-memory counts and their parameters' Table A.2 groups)
        hf.py       its Hugging Face mapping: config.json and tensor names, both ways
        spec.py     FAMILY = FamilySpec(...): what the rest of the project asks
                    (framework/families/registry.py reads it)

Adding a family is adding its folder (and its tests): the config's ``family`` choice and
fields, ``build_decoder``, the FLOP and memory formulas, the parameter groups, the Hugging
Face reader (by ``model_type``) and writer all come from the folder.

``ModelConfig`` keeps the fields every family shares and takes every family's own fields
from ``FamilyFields`` (keyword-only, after the shared ones), so a recipe, a checkpoint's
config and the command line spell a family field as they spell any other
(``model.decoder.rope_theta``). A field of another family must stay at its default: the
blocks of this one would ignore it.

This module holds only the names, the fields and the config rules, so that
framework/config.py can build ``ModelConfig`` from it; everything that builds a model is in
framework/families/registry.py, which imports the config (never the other way round).
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
import typing
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from framework.config import ModelConfig

DEFAULT_FAMILY = "celerity"  # the paper's decoder (framework/model/decoder.py)
# Every sub-package is a family; the default first, the rest alphabetical.
FAMILY_NAMES: tuple[str, ...] = tuple(sorted((m.name for m in pkgutil.iter_modules(__path__) if m.ispkg),
                                             key=lambda name: (name != DEFAULT_FAMILY, name)))


def family_rules(name: str) -> ModuleType:
    """The ``rules`` module of the family ``name``: its ``ARGS`` and ``check``."""
    return importlib.import_module(f"{__name__}.{name}.rules")


def _family_fields() -> tuple[type, dict[str, tuple[str, ...]]]:
    """The dataclass of every family's own fields (each once) and field -> the families that own it."""
    found: dict[str, tuple[dataclasses.Field, Any]] = {}
    owners: dict[str, tuple[str, ...]] = {}
    for name in FAMILY_NAMES:
        args = family_rules(name).ARGS
        if args is None:
            continue
        hints = typing.get_type_hints(args, include_extras=True)
        for field in dataclasses.fields(args):
            if field.name in found and (found[field.name][0].default, found[field.name][1]) != \
                    (field.default, hints[field.name]):
                raise TypeError(f"family {name!r} declares the field {field.name!r} of "
                                f"{', '.join(owners[field.name])} with another type or default: share its ARGS")
            found.setdefault(field.name, (field, hints[field.name]))
            owners[field.name] = (*owners.get(field.name, ()), name)
    declared = [(f.name, hint, dataclasses.field(default=f.default)) for f, hint in found.values()]
    return dataclasses.make_dataclass("FamilyFields", declared, frozen=True, kw_only=True,
                                      namespace={"__module__": __name__}), owners


FamilyFields, FIELD_OWNERS = _family_fields()


def check_family_rules(cfg: ModelConfig) -> None:
    """The fields of other families at their defaults, then ``cfg.family``'s own rules
    (ValueError, one line naming the field)."""
    rules = family_rules(cfg.family)
    own = {f.name for f in dataclasses.fields(rules.ARGS)} if rules.ARGS is not None else set()
    for field in dataclasses.fields(FamilyFields):
        value = getattr(cfg, field.name)
        if field.name not in own and value != field.default:
            raise ValueError(f"{field.name}={value!r} is invalid for family={cfg.family!r}: it is a field of "
                             f"{', '.join(FIELD_OWNERS[field.name])} (default {field.default!r})")
    rules.check(cfg)


__all__ = ["FAMILY_NAMES", "DEFAULT_FAMILY", "FamilyFields", "FIELD_OWNERS", "family_rules", "check_family_rules"]

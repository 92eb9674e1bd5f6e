"""Model families: one folder each under framework/families/, found by looking.

    framework/families/<name>/
        rules.py    check(cfg): the ModelConfig rules of the family; imports nothing of the
                    project, since framework/config.py asks it while a config is validated
        blocks.py   its Decoder subclass and the parts of its blocks (with their FLOP and
                    activation-memory counts)
        hf.py       its Hugging Face mapping: config.json and tensor names, both ways
        spec.py     FAMILY = FamilySpec(...): what the rest of the project asks
                    (framework/families/registry.py reads it)

Adding a family is adding its folder (and its tests): the config's ``family`` choice,
``build_decoder``, the FLOP and memory formulas, the Hugging Face reader (by
``model_type``) and writer all come from the folder.

This module holds only the names and the config rules, so that framework/config.py can
build its ``family`` choice from it; everything that builds a model is in
framework/families/registry.py, which imports the config (never the other way round).
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from framework.config import ModelConfig

DEFAULT_FAMILY = "celerity"  # the paper's decoder (framework/model/decoder.py)
# Every sub-package is a family; the default first, the rest alphabetical.
FAMILY_NAMES: tuple[str, ...] = tuple(sorted((m.name for m in pkgutil.iter_modules(__path__) if m.ispkg),
                                             key=lambda name: (name != DEFAULT_FAMILY, name)))


def check_family_rules(cfg: ModelConfig) -> None:
    """Apply ``cfg.family``'s own config rules (ValueError, one line naming the field)."""
    importlib.import_module(f"{__name__}.{cfg.family}.rules").check(cfg)


__all__ = ["FAMILY_NAMES", "DEFAULT_FAMILY", "check_family_rules"]

"""The families' specs, by name and by Hugging Face ``model_type``: every reader and
writer of a model asks here (build a decoder or a block, count its FLOPs and memory,
read or write a Hugging Face folder).

A family is a folder under framework/families/ with a ``spec.py`` holding ``FAMILY``;
the folders are found by looking (framework/families/__init__.py), so adding one
touches no list here.
"""

from __future__ import annotations

import importlib
from functools import cache

import torch.nn as nn

from framework.config import ModelConfig
from framework.families import FAMILY_NAMES
from framework.families.family_spec import FamilySpec
from framework.model.decoder import Decoder


@cache
def family_spec(name: str) -> FamilySpec:
    """The spec of the family ``name`` (one of FAMILY_NAMES)."""
    if name not in FAMILY_NAMES:
        raise ValueError(f"family={name!r} is invalid: allowed: {', '.join(FAMILY_NAMES)}")
    return importlib.import_module(f"framework.families.{name}.spec").FAMILY


def all_specs() -> list[FamilySpec]:
    return [family_spec(name) for name in FAMILY_NAMES]


def build_decoder(cfg: ModelConfig) -> Decoder:
    """The decoder of ``cfg.family``."""
    return family_spec(cfg.family).decoder(cfg)


def new_block(cfg: ModelConfig, layer_index: int) -> nn.Module:
    """One block of ``cfg.family`` (``layer_index`` numbers its KV-cache slot)."""
    return family_spec(cfg.family).block(cfg, layer_index)


def hf_model_types() -> dict[str, FamilySpec]:
    """Hugging Face ``model_type`` -> the family that reads it."""
    return {spec.hf.model_type: spec for spec in all_specs() if spec.hf is not None}


def hf_families() -> list[str]:
    """The families with a transformers class, for error messages."""
    return [spec.name for spec in all_specs() if spec.hf is not None]


__all__ = ["family_spec", "all_specs", "build_decoder", "new_block", "hf_model_types", "hf_families"]

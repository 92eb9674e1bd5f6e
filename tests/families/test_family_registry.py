"""framework/families/registry.py (and the names in framework/families/__init__.py): every
folder under framework/families/ is a family, found by looking, and nothing outside the
folders names one."""

from __future__ import annotations

import re
import typing
from pathlib import Path

import pytest

from framework.config import ModelConfig
from framework.families import DEFAULT_FAMILY, FAMILY_NAMES
from framework.families.registry import all_specs, family_spec, hf_families, hf_model_types

FRAMEWORK = Path(__file__).resolve().parents[2] / "framework"


def test_every_folder_is_a_family_and_the_configs_choice():
    folders = sorted(p.name for p in (FRAMEWORK / "families").iterdir() if (p / "__init__.py").is_file())
    assert sorted(FAMILY_NAMES) == folders and FAMILY_NAMES[0] == DEFAULT_FAMILY
    assert typing.get_args(typing.get_type_hints(ModelConfig)["family"]) == FAMILY_NAMES
    for name in FAMILY_NAMES:
        spec = family_spec(name)
        assert spec.name == spec.decoder.family == name
        assert spec.hf is None or spec.hf.family == name


def test_hugging_face_model_types_route_to_their_own_family():
    types = hf_model_types()
    assert len(types) == len(hf_families()) == sum(spec.hf is not None for spec in all_specs())
    assert {"llama", "qwen2", "qwen3"} <= set(types)
    assert {spec.name for spec in types.values()} == set(hf_families())


def test_an_unknown_family_is_refused_in_one_line():
    with pytest.raises(ValueError, match=f"^family='gpt2' is invalid: allowed: {', '.join(FAMILY_NAMES)}$"):
        family_spec("gpt2")


def test_no_module_outside_the_families_names_one():
    """The seam: config, checkpoint readers and writers, FLOPs and memory ask the registry
    (the default Decoder's own ``family`` attribute is the one exception: it is Celerity's class)."""
    named = re.compile("[\"'](" + "|".join(n for n in FAMILY_NAMES if n != DEFAULT_FAMILY) + ")[\"']")
    found = [f"{path.relative_to(FRAMEWORK)}:{n}" for path in sorted(FRAMEWORK.rglob("*.py"))
             if "families" not in path.relative_to(FRAMEWORK).parts
             for n, line in enumerate(path.read_text().splitlines(), 1) if named.search(line)]
    assert found == []

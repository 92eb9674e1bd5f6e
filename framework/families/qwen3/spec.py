"""The Qwen3 family's spec."""

from __future__ import annotations

from framework.families.family_spec import FamilySpec
from framework.families.qwen3.blocks import Qwen3Decoder
from framework.families.qwen3.hf import Qwen3Mapping

FAMILY = FamilySpec(name="qwen3", decoder=Qwen3Decoder, hf=Qwen3Mapping())

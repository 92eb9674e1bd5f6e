"""The Qwen2 family's spec."""

from __future__ import annotations

from framework.families.family_spec import FamilySpec
from framework.families.qwen2.blocks import Qwen2Decoder
from framework.families.qwen2.hf import Qwen2Mapping

FAMILY = FamilySpec(name="qwen2", decoder=Qwen2Decoder, hf=Qwen2Mapping())

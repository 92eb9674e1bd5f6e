"""The Llama family's spec."""

from __future__ import annotations

from framework.families.family_spec import FamilySpec
from framework.families.llama.blocks import LlamaDecoder
from framework.families.llama.hf import LlamaMapping

FAMILY = FamilySpec(name="llama", decoder=LlamaDecoder, hf=LlamaMapping())

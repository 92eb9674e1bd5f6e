"""The Gemma family's spec."""

from __future__ import annotations

from framework.families.family_spec import FamilySpec
from framework.families.gemma.blocks import GemmaDecoder
from framework.families.gemma.hf import GemmaMapping

FAMILY = FamilySpec(name="gemma", decoder=GemmaDecoder, hf=GemmaMapping())

"""The Celerity family's spec: framework/model/decoder.py's Decoder, no Hugging Face class."""

from __future__ import annotations

from framework.families.family_spec import FamilySpec
from framework.model.decoder import Decoder

FAMILY = FamilySpec(name="celerity", decoder=Decoder, hf=None, shapes_need_heads=False)

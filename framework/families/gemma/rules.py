"""The Gemma family's config: Llama's fields (tying, RoPE) and rules."""

from __future__ import annotations

from framework.families.llama.rules import ARGS, check

__all__ = ["ARGS", "check"]

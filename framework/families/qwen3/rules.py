"""The Qwen3 family's config: Llama's fields and rules."""

from __future__ import annotations

from framework.families.llama.rules import ARGS, check

__all__ = ["ARGS", "check"]

"""The Qwen3 family's config rules: Llama's."""

from __future__ import annotations

from framework.families.llama.rules import check

__all__ = ["check"]

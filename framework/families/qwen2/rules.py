"""The Qwen2 family's config rules: Llama's (its q/k/v biases are the family's own, so
``bias`` stays false)."""

from __future__ import annotations

from framework.families.llama.rules import check

__all__ = ["check"]

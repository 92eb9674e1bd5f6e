"""The Qwen2 family's config: Llama's fields and rules (its q/k/v biases are the family's
own, so ``bias`` stays false)."""

from __future__ import annotations

from framework.families.llama.rules import ARGS, check

__all__ = ["ARGS", "check"]

"""A recipe's value at a dotted key ("model.parametrization.lr"): one reader for the sweep
file's model (spec) and the compute-matched runs (compute_matched), which spec
imports, so it lives below both."""

from __future__ import annotations

from typing import Any


def get_dotted(config: dict, key: str, default: Any = None) -> Any:
    node: Any = config
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return node


__all__ = ["get_dotted"]

"""The Celerity family's config: no fields of its own (``ARGS = None``: the other families'
fields must stay at their defaults, framework/families/__init__.py); its attention has
one key/value head per query head."""

from __future__ import annotations

from typing import Any

ARGS = None


def check(cfg: Any) -> None:
    if cfg.n_kv_heads != cfg.n_heads:
        raise ValueError(f"n_kv_heads={cfg.n_kv_heads!r} is invalid for family='celerity': its attention has "
                         f"one key/value head per query head (n_kv_heads={cfg.n_heads})")

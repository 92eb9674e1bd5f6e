"""Nested mappings written as block YAML with a comment beside chosen keys (what
`layerdrop recipe` writes: every derived number says how it was derived). PyYAML
drops comments, so the lines are emitted here; each value is dumped by PyYAML, so
it reads back as the same value."""

from __future__ import annotations

from typing import Any

import yaml


def commented_yaml(node: dict[str, Any], comments: dict[str, str], *, prefix: str = "", indent: int = 0) -> list[str]:
    """The lines of ``node`` as block YAML, each key whose dotted path is in ``comments``
    followed by its comment (after the line padded to 32 characters)."""
    lines = []
    for key, value in node.items():
        dotted = f"{prefix}{key}"
        pad = " " * indent
        if isinstance(value, dict):
            lines.append(f"{pad}{key}:")
            lines += commented_yaml(value, comments, prefix=f"{dotted}.", indent=indent + 2)
            continue
        line = f"{pad}{key}: {scalar(value)}"
        if dotted in comments:
            line = f"{line:<32} # {comments[dotted]}"
        lines.append(line)
    return lines


def scalar(value: Any) -> str:
    """One YAML value; floats far from 1 in the scientific form YAML reads as a float."""
    if isinstance(value, float) and value != 0 and not 1e-4 <= abs(value) < 1e6:
        mantissa, exponent = f"{value:.10e}".split("e")
        mantissa = mantissa.rstrip("0") + ("0" if mantissa.rstrip("0").endswith(".") else "")
        text = f"{mantissa}e{int(exponent):+03d}"
        if yaml.safe_load(text) == value:
            return text
    return yaml.safe_dump([value], default_flow_style=True, width=10_000).strip()[1:-1]


__all__ = ["commented_yaml", "scalar"]

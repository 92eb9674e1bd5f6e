"""Small files that become large problems: YAML whose aliases expand to billions of values,
JSON nested thousands of levels deep."""

from __future__ import annotations


def billion_laughs(levels: int = 9, width: int = 9) -> str:
    """``a0`` holds ``width`` strings; each next anchor ``width`` aliases of the one before:
    a ~600-byte YAML mapping that written out holds width**levels values."""
    lines = [f"a0: &a0 [{', '.join(['lol'] * width)}]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * width)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


def deep_json(depth: int) -> str:
    """A JSON list nested ``depth`` levels deep."""
    return "[" * depth + "]" * depth

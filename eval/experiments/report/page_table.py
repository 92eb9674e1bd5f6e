"""How the report's page prints a table and a p-value: shared by its sections (markdown.py and the
sections rendered beside their numbers, as own_optimum.py)."""

from __future__ import annotations


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    """A Markdown table's lines."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def p_text(value: float) -> str:
    """A p-value as the page prints it: two significant digits below 0.001, else three decimals."""
    return f"{value:.2g}" if value < 0.001 else f"{value:.3f}"


__all__ = ["table", "p_text"]

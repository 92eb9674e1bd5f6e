"""The dependency direction of DESIGN.md: framework/ imports neither eval/ nor data_prep/
(only the CLI router does, lazily, and pretraining names eval's callback by class path)."""

from __future__ import annotations

import ast
from pathlib import Path

FRAMEWORK = Path(__file__).resolve().parents[1] / "framework"


def test_framework_library_code_never_imports_eval_or_data_prep():
    offenders = []
    for path in sorted(FRAMEWORK.glob("*.py")):
        if path.name == "cli.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            offenders += [f"{path.name}: {name}" for name in names if name.split(".")[0] in ("eval", "data_prep")]
    assert offenders == []

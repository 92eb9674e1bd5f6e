"""The dependency direction of DESIGN.md: framework/ imports neither eval/ nor data_prep/
(only the CLI router does, lazily, and pretraining names eval's callback by class path),
and no modules of the project import each other in a circle (an import inside a
function counts: moving one there does not remove the circle)."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FRAMEWORK = REPO / "framework"
PACKAGES = ("framework", "eval", "data_prep")


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, known: set[str]) -> set[str]:
    """The project modules ``path`` imports (anywhere in it): for ``from a.b import c``,
    ``a.b.c`` when that is a module, else ``a.b``."""
    found = set()
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the package, one level up per extra dot
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            found |= {f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names}
    return {name for name in found if name in known}


def project_graph() -> dict[str, set[str]]:
    paths = [path for package in PACKAGES for path in sorted((REPO / package).rglob("*.py"))]
    known = {module_name(path) for path in paths}
    return {module_name(path): imported_modules(path, known) - {module_name(path)} for path in paths}


def test_framework_library_code_never_imports_eval_or_data_prep():
    offenders = []
    for path in sorted(FRAMEWORK.rglob("*.py")):
        if path.name == "cli.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            offenders += [f"{path.name}: {name}" for name in names if name.split(".")[0] in ("eval", "data_prep")]
    assert offenders == []


def circles_through(graph: dict[str, set[str]], starts: list[str]) -> list[str]:
    """Every circle (as "a -> b -> a") that passes through one of ``starts``."""
    circles = []
    for start in starts:
        stack, seen = [(start, (start,))], set()
        while stack:
            name, trail = stack.pop()
            for target in sorted(graph.get(name, ())):
                if target == start:
                    circles.append(" -> ".join(trail + (start,)))
                elif target not in seen:
                    seen.add(target)
                    stack.append((target, trail + (target,)))
    return circles


def test_no_import_circle_passes_through_the_checkpoint_package():
    graph = project_graph()
    assert "framework.checkpoint.base" in graph["framework.checkpoint.loader"]  # the graph sees the package
    starts = sorted(name for name in graph if name.startswith(("framework.checkpoint", "framework.atomic_write")))
    assert circles_through(graph, starts) == []


def test_the_circle_finder_finds_circles():
    graph = {"p.a": {"p.b"}, "p.b": {"p.c"}, "p.c": {"p.a"}, "p.d": {"p.a"}}
    assert circles_through(graph, ["p.a", "p.d"]) == ["p.a -> p.b -> p.c -> p.a"]

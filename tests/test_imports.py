"""The import structure of DESIGN.md, read from the code:

- no import circle among the project's modules (framework/, eval/, data_prep/,
  benchmarks/): every import that can run counts, at module level or inside a function
  (an import moved into a function to dodge a circle is still one); the names under
  ``if TYPE_CHECKING:`` never run (annotations only) and do not;
- framework/'s library code imports neither eval/ nor data_prep/ (only the CLI front
  door, framework/cli.py, wires their commands in, by lazy class-path strings);
- framework/ is in layers (docs/layers.md, ``LAYERS`` below): a module imports only
  modules of its own layer or of a layer below. Here every import counts, names for
  annotations under ``if TYPE_CHECKING:`` too: a lower layer knows nothing of a higher
  one, not even its types.

Importing a module also runs the ``__init__`` of every package above it, so an import
of ``a.b.c`` depends on ``a`` and ``a.b`` too, except on the packages that hold the
importer itself (those are already running when it runs).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("framework", "eval", "data_prep", "benchmarks")
FRONT_DOOR = "framework.cli"


def module_files(root: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every .py file of the project's packages under root."""
    modules = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def imported_names(path: Path, module: str, *, type_only_too: bool = False) -> list[str]:
    """Every dotted name an import statement anywhere in the file asks for; ``from m import
    x`` gives ``m.x`` (a submodule when there is one, else a name of m)."""
    return [name for _, name in import_lines(path, module, type_only_too=type_only_too)]


def import_lines(path: Path, module: str, *, type_only_too: bool = False) -> list[tuple[int, str]]:
    """(line, dotted name) of every import statement anywhere in the file (see
    ``imported_names``); those under ``if TYPE_CHECKING:`` only with ``type_only_too``."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    type_only = set() if type_only_too else {
        id(n) for block in ast.walk(tree) if _is_type_checking(block) for s in block.body for n in ast.walk(s)}
    names = []
    for node in ast.walk(tree):
        if id(node) in type_only:
            continue
        if isinstance(node, ast.Import):
            names += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            names += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
    return names


def _is_type_checking(node: ast.AST) -> bool:
    """``if TYPE_CHECKING:`` (or ``typing.TYPE_CHECKING``): names for annotations only, never run."""
    if not isinstance(node, ast.If):
        return False
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def dependencies(name: str, importer: str, modules: dict[str, Path]) -> set[str]:
    """The project modules that importing ``name`` from ``importer`` runs: the longest
    prefix of ``name`` that is a module, and the packages above it that do not hold
    the importer."""
    parts = name.split(".")
    found = next((".".join(parts[:n]) for n in range(len(parts), 0, -1) if ".".join(parts[:n]) in modules), None)
    if found is None:
        return set()
    pieces = found.split(".")
    chain = {".".join(pieces[:n]) for n in range(1, len(pieces) + 1)}
    own = {".".join(importer.split(".")[:n]) for n in range(1, importer.count(".") + 2)}
    return {m for m in chain if m in modules and (m == found or m not in own)} - {importer}


def import_graph(root: Path) -> dict[str, set[str]]:
    modules = module_files(root)
    return {module: set().union(*[dependencies(n, module, modules) for n in imported_names(path, module)])
            for module, path in modules.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One import path around each strongly connected group of modules (Tarjan's
    algorithm, iterative: the graph has a few hundred nodes)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.add(member)
                    if member == node:
                        break
                if len(group) > 1:
                    groups.append(group)
    return [cycle_through(group, graph) for group in groups]


def cycle_through(group: set[str], graph: dict[str, set[str]]) -> list[str]:
    """A shortest import path from the group's first module back to itself."""
    start = min(group)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for child in sorted(graph[node] & group):
                if child == start:
                    return paths[node] + [start]
                if child not in paths:
                    paths[child] = paths[node] + [child]
                    following.append(child)
        frontier = following
    raise AssertionError(f"{sorted(group)} is not strongly connected")


def test_no_module_imports_itself_through_others():
    graph = import_graph(REPO)
    found = [" -> ".join(cycle) for cycle in circles(graph)]
    assert found == [], "import circles:\n" + "\n".join(found)


def test_framework_library_code_never_imports_eval_or_data_prep():
    graph = import_graph(REPO)
    offenders = sorted(f"{module} imports {target}" for module, targets in graph.items()
                       if module.split(".")[0] == "framework" and module != FRONT_DOOR
                       for target in targets if target.split(".")[0] in ("eval", "data_prep"))
    assert offenders == []


# framework/'s layers, lowest first (docs/layers.md says why each part sits where it
# does). A module is in the layer of the longest name here that is the module itself or
# a package above it; "<package>.__init__" names only that package's own __init__.py
# (framework/families/__init__.py: the family names and rules hook config.py reads).
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("files", ("framework.__init__", "framework.files")),
    ("console", ("framework.console",)),
    ("config", ("framework.config", "framework.command_parser", "framework.schedules", "framework.layer_dropout",
                "framework.early_exit_loss", "framework.families.__init__")),
    ("model", ("framework.model",)),
    ("families", ("framework.families",)),
    ("flops", ("framework.flops",)),
    ("tokenizer", ("framework.tokenizer",)),
    ("checkpoint", ("framework.checkpoint",)),
    ("strategies", ("framework.strategies",)),
    ("training", ("framework.training",)),
    ("recipes", ("framework.recipes",)),
    ("cli", ("framework.cli",)),
)


def layer_of(module: str, path: Path) -> int | None:
    """The index in LAYERS of the module at ``path``; None when LAYERS does not place it."""
    key = f"{module}.__init__" if path.name == "__init__.py" else module
    found = [(len(name), index) for index, (_, names) in enumerate(LAYERS) for name in names
             if key == name or key.startswith(f"{name}.")]
    return max(found)[1] if found else None


def upward_imports(root: Path) -> list[str]:
    """One line for every import in framework/ that reaches a higher layer, and for
    every module of framework/ that LAYERS leaves out."""
    modules = module_files(root)
    found = []
    for module, path in modules.items():
        if module.split(".")[0] != "framework":
            continue
        where, own = path.relative_to(root).as_posix(), layer_of(module, path)
        if own is None:
            found.append(f"{where}: {module} is in no layer (add it to LAYERS and docs/layers.md)")
            continue
        for line, name in import_lines(path, module, type_only_too=True):
            higher = sorted({(layer, target) for target in dependencies(name, module, modules)
                             if target.split(".")[0] == "framework"
                             for layer in [layer_of(target, modules[target])] if layer is not None and layer > own})
            if higher:
                layer, target = higher[-1]
                found.append(f"{where}:{line}: {module} ({LAYERS[own][0]}) imports {target} ({LAYERS[layer][0]})")
    return list(dict.fromkeys(found))  # ``from m import a, b``: one line


def test_framework_imports_only_downward():
    assert upward_imports(REPO) == [], "imports that go up a layer (docs/layers.md):\n" + "\n".join(
        upward_imports(REPO))


def test_the_layers_find_an_upward_import_wherever_it_hides(tmp_path):
    _write(tmp_path, {
        "framework/__init__.py": "", "framework/config.py": "", "framework/training/__init__.py": "",
        "framework/training/nonfinite.py": "from framework import config\n",
        "framework/checkpoint/__init__.py": "from framework.checkpoint.saving import save\n",
        # at module level, hidden in a function, and for annotations only: all three go up
        "framework/checkpoint/saving.py": "import framework.training.nonfinite\n"
                                          "def save():\n    from framework.training import nonfinite\n",
        "framework/checkpoint/typed.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                         "    from framework.training.nonfinite import Guard\n",
        "framework/families/__init__.py": "from framework.config import x\n",  # the front sits with config
        "framework/families/registry.py": "from framework.checkpoint import y\n",
        "framework/newcomer.py": "",
    })
    assert upward_imports(tmp_path) == [
        "framework/checkpoint/saving.py:1: framework.checkpoint.saving (checkpoint) imports "
        "framework.training.nonfinite (training)",
        "framework/checkpoint/saving.py:3: framework.checkpoint.saving (checkpoint) imports "
        "framework.training.nonfinite (training)",
        "framework/checkpoint/typed.py:3: framework.checkpoint.typed (checkpoint) imports "
        "framework.training.nonfinite (training)",
        "framework/families/registry.py:1: framework.families.registry (families) imports "
        "framework.checkpoint (checkpoint)",
        "framework/newcomer.py: framework.newcomer is in no layer (add it to LAYERS and docs/layers.md)",
    ]


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


@pytest.mark.parametrize("files, expected", [
    # an import hidden in a function closes the circle all the same
    ({"eval/a.py": "from eval.b import x\n", "eval/b.py": "def f():\n    from eval import a\n"},
     ["eval.a", "eval.b", "eval.a"]),
    # relative imports, three modules round
    ({"eval/p/__init__.py": "", "eval/p/a.py": "from .b import y\n", "eval/p/b.py": "from ..c import z\n",
      "eval/c.py": "import eval.p.a\n"}, ["eval.c", "eval.p.a", "eval.p.b", "eval.c"]),
    # a package facade that its own module imports back
    ({"framework/ck/__init__.py": "from framework.ck.forms import load\n",
      "framework/ck/forms.py": "def load():\n    from framework.ck.helper import h\n",
      "framework/ck/helper.py": "def h():\n    from framework.ck import load\n"},
     ["framework.ck", "framework.ck.forms", "framework.ck.helper", "framework.ck"]),
])
def test_the_graph_finds_a_planted_circle(tmp_path, files, expected):
    _write(tmp_path, files)
    assert circles(import_graph(tmp_path)) == [expected]


def test_the_graph_allows_siblings_and_what_is_not_a_circle(tmp_path):
    _write(tmp_path, {"eval/__init__.py": "", "eval/p/__init__.py": "", "eval/p/a.py": "from eval.p.b import y\n",
                      "eval/p/b.py": "import json\nfrom framework.model import Decoder\n",
                      "framework/model.py": "import torch\nfrom typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                            "    from eval.p.b import y\n",
                      "data_prep/x.py": "from eval.p import a\n"})
    graph = import_graph(tmp_path)
    assert graph["eval.p.a"] == {"eval.p.b"} and graph["data_prep.x"] == {"eval", "eval.p", "eval.p.a"}
    assert graph["eval.p.b"] == {"framework.model"} and graph["framework.model"] == set()  # type names only
    assert circles(graph) == []

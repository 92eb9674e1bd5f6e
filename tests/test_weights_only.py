"""Every ``torch.load`` in the project's code passes ``weights_only=True``: a file a user
was handed can hold tensors and plain data, never objects whose unpickling runs code.

Checked on the source (AST), so a load path no test reaches — an exported folder's
training record, a benchmark — is covered the day it is written.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CODE = sorted(path for folder in ("framework", "eval", "data_prep", "benchmarks")
              for path in (REPO / folder).rglob("*.py"))


def unsafe_loads(source: str) -> list[tuple[int, str]]:
    """(line, call) of each torch.load — however torch or load was imported — whose
    ``weights_only`` is not the literal True."""
    tree = ast.parse(source)
    torch_names, load_names = {"torch"}, set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            torch_names |= {a.asname or a.name for a in node.names if a.name == "torch"}
        elif isinstance(node, ast.ImportFrom) and node.module in ("torch", "torch.serialization"):
            load_names |= {a.asname or a.name for a in node.names if a.name == "load"}
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        is_load = (isinstance(func, ast.Name) and func.id in load_names) or (
            isinstance(func, ast.Attribute) and func.attr == "load"
            and ast.unparse(func.value) in {*torch_names, *(f"{t}.serialization" for t in torch_names)})
        if not is_load:
            continue
        flag = next((k.value for k in node.keywords if k.arg == "weights_only"), None)
        if not (isinstance(flag, ast.Constant) and flag.value is True):
            found.append((node.lineno, ast.unparse(node)))
    return found


def test_every_torch_load_in_the_code_is_weights_only():
    loads = {str(path.relative_to(REPO)): unsafe_loads(path.read_text()) for path in CODE}
    assert "torch.load" in "".join(path.read_text() for path in CODE)  # the scan has something to see
    assert {where: calls for where, calls in loads.items() if calls} == {}


@pytest.mark.parametrize("source, unsafe", [
    ("import torch\ntorch.load(p, weights_only=True)\n", 0),
    ("import torch\ntorch.load(p)\n", 1),
    ("import torch\ntorch.load(p, map_location='cpu', weights_only=False)\n", 1),
    ("import torch\nflag = True\ntorch.load(p, weights_only=flag)\n", 1),  # not provably True
    ("import torch as t\nt.load(p)\n", 1),
    ("from torch import load\nload(p)\n", 1),
    ("from torch import load as read\nread(p, weights_only=True)\nread(q)\n", 1),
    ("import torch\ntorch.serialization.load(p)\n", 1),
    ("import json\njson.load(f)\n", 0),
])
def test_the_scan_finds_every_form_of_an_unsafe_load(source, unsafe):
    assert len(unsafe_loads(source)) == unsafe

"""Bounds on nested documents a user hands us (framework/files/nesting.py)."""

from __future__ import annotations

import json
import tracemalloc

import pytest
import yaml

from framework.files.nesting import (ALIAS_BUDGET, MAX_DEPTH, NestingError, bounded_yaml_loader, check_yaml,
                                     json_document, yaml_document)
from tests.helpers.hostile_files import billion_laughs, deep_json


def test_a_billion_laughs_is_refused_before_any_expansion():
    tracemalloc.start()
    try:
        with pytest.raises(NestingError) as refusal:
            yaml_document(billion_laughs(), "--config 'laughs.yaml'")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert str(refusal.value).startswith("--config 'laughs.yaml' is refused: its YAML aliases repeat more than")
    assert "\n" not in str(refusal.value)
    assert peak < 5_000_000  # counted from parser events, never built (9**9 values would be gigabytes)


def test_aliases_that_repeat_a_little_load_as_safe_load_reads_them():
    text = "base: &base {lr: 0.001, warmup: 10}\nrun_a: *base\nrun_b: {<<: *base, lr: 0.002}\nlrs: [*base, *base]\n"
    assert yaml_document(text, "x") == yaml.safe_load(text)
    assert yaml_document(billion_laughs(levels=4, width=9), "x") == yaml.safe_load(billion_laughs(levels=4, width=9))
    assert yaml_document("", "x") is None and yaml_document("a: 1", "x") == {"a": 1}


def test_the_alias_budget_counts_the_values_aliases_add():
    # one anchored list of n scalars, aliased k times, adds k * (n + 1) values
    def aliased(n: int, k: int) -> str:
        return f"a: &a [{', '.join(['0'] * n)}]\nb: [{', '.join(['*a'] * k)}]\n"

    check_yaml(aliased(999, 100), "x")  # 100,000 added: at the budget
    assert 100 * 1000 == ALIAS_BUDGET
    with pytest.raises(NestingError):
        check_yaml(aliased(999, 101), "x")


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 900])
def test_deep_yaml_is_refused_in_one_line(depth):
    with pytest.raises(NestingError, match=rf"^deep.yaml is refused: it is nested more than {MAX_DEPTH} levels deep$"):
        yaml_document("[" * depth + "]" * depth, "deep.yaml")
    assert yaml_document("[" * (MAX_DEPTH - 1) + "]" * (MAX_DEPTH - 1), "x") is not None


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 5_000, 200_000])
def test_deep_json_is_refused_not_a_recursion_error(depth):
    with pytest.raises(NestingError, match=rf"^--prompts 'p.json' is refused: it is nested more than {MAX_DEPTH}"):
        json_document(deep_json(depth), "--prompts 'p.json'")
    assert json_document(deep_json(MAX_DEPTH), "x") is not None
    assert json_document('{"a": [1, {"b": 2}]}', "x") == {"a": [1, {"b": 2}]}
    with pytest.raises(json.JSONDecodeError):
        json_document("{", "x")


def test_a_bounded_loader_checks_the_strings_it_returns_too():
    """jsonargparse reads a string value as YAML again: a bomb quoted as a string is refused."""
    calls = []

    def load(text):
        calls.append(text)
        return yaml.safe_load(text)

    bounded = bounded_yaml_loader(load, "a recipe")
    assert bounded("a: &x 1\nb: *x\nc: '[1, 2]'\nd: 'R&D'") == {"a": 1, "b": 1, "c": "[1, 2]", "d": "R&D"}
    quoted = yaml.safe_dump({"distribution": billion_laughs().replace("\n", ", ").join("{}")})
    with pytest.raises(NestingError, match="^a recipe is refused: its YAML aliases"):
        bounded(quoted)
    with pytest.raises(NestingError):
        bounded(billion_laughs())
    assert len(calls) == 2  # the bomb itself never reached the wrapped loader

"""Bounds on the nesting of a document a user hands us (a YAML recipe or sweep file, a
JSON prompts file, manifest, lock or config), checked before anything walks it.

Two ways a small file becomes a large problem:

- **Depth.** ``[[[[…]]]]`` a few thousand levels deep: PyYAML's composer and Python's
  ``json`` recurse once per level and die with a ``RecursionError`` traceback, and so
  does any code that walks the result. Refused past ``MAX_DEPTH`` levels (recipes are
  ~5 deep; an HF config.json ~4).
- **Aliases** (YAML only). ``&a [x, x, …]``, ``&b [*a, *a, …]``, … nine levels of nine
  ("billion laughs", 1.6 KB) load as a few hundred shared nodes, but anything that copies
  or walks the result as a tree (jsonargparse does) builds 9⁹ values: 4 GB and counting
  in a minute. The size the document would have with every alias written out is counted
  from the parser's events (each anchor's size once), before any Python object is built;
  aliases may add at most ``ALIAS_BUDGET`` values. Legitimate reuse (an anchor
  for a learning rate, a shared block of a sweep file) stays far below it.

Both refusals are a ``NestingError`` (a ``ValueError``): one line naming the file.
"""

from __future__ import annotations

import json
from typing import Any, Callable

import yaml

MAX_DEPTH = 100
ALIAS_BUDGET = 100_000
_PARSER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class NestingError(ValueError):
    """A document nested too deep, or whose aliases expand too far: one line naming it."""


def yaml_document(text: str, where: str) -> Any:
    """``yaml.safe_load(text)``, refusing (``NestingError``) a document deeper than
    ``MAX_DEPTH`` or whose aliases would add more than ``ALIAS_BUDGET`` values;
    malformed YAML raises ``yaml.YAMLError`` as ``safe_load`` does."""
    check_yaml(text, where)
    return yaml.safe_load(text)


def bounded_yaml_loader(load: Callable[[str], Any], where: str) -> Callable[[str], Any]:
    """``load`` (another YAML loader: jsonargparse's, which reads every recipe file, value and
    file a value names) behind ``check_yaml``; its strings are checked too, since jsonargparse
    reads a string value as YAML again when a type asks for more than a string."""
    def bounded(text: str) -> Any:
        check_yaml(text, where)
        document = load(text)
        for string in _strings(document):
            if "&" in string or string.lstrip().startswith(("[", "{")):
                try:
                    check_yaml(string, where)
                except yaml.YAMLError:
                    continue  # not YAML: a plain string
        return document

    bounded.bounds = load  # type: ignore[attr-defined]
    return bounded


def check_yaml(text: str, where: str) -> None:
    """``NestingError`` if ``text`` nests deeper than ``MAX_DEPTH`` or its aliases would add more
    than ``ALIAS_BUDGET`` values. Read as parser events (libyaml's parser where PyYAML has it:
    no recursion, no Python object built), each anchor's written-out size counted once."""
    # One entry per open sequence/mapping: [its anchor, values in it written out].
    open_nodes: list[list[Any]] = [[None, 0]]
    sizes: dict[str, int] = {}
    distinct = 0
    for event in yaml.parse(text, Loader=_PARSER):
        if isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
            distinct += 1
            open_nodes.append([event.anchor, 1])
            if len(open_nodes) - 1 > MAX_DEPTH:
                raise _too_deep(where)
            continue
        if isinstance(event, yaml.AliasEvent):
            size = sizes.get(event.anchor, 1)  # an undefined alias: safe_load refuses it
        elif isinstance(event, yaml.ScalarEvent):
            distinct, size = distinct + 1, 1
            if event.anchor is not None:
                sizes[event.anchor] = 1
        elif isinstance(event, (yaml.SequenceEndEvent, yaml.MappingEndEvent)):
            anchor, size = open_nodes.pop()
            if anchor is not None:
                sizes[anchor] = size
        else:
            continue  # stream and document boundaries
        open_nodes[-1][1] += size
        if open_nodes[0][1] - distinct > ALIAS_BUDGET:
            raise NestingError(f"{where} is refused: its YAML aliases repeat more than {ALIAS_BUDGET:,} "
                               "values; write the repeated values out")


def json_document(text: str, where: str) -> Any:
    """``json.loads(text)``, refusing (``NestingError``) a document deeper than
    ``MAX_DEPTH``; malformed JSON raises ``json.JSONDecodeError`` as ``json.loads`` does."""
    try:
        document = json.loads(text)
    except RecursionError:  # far deeper than MAX_DEPTH: the parser itself ran out of stack
        raise _too_deep(where) from None
    if _depth(document) > MAX_DEPTH:
        raise _too_deep(where)
    return document


def _too_deep(where: str) -> NestingError:
    return NestingError(f"{where} is refused: it is nested more than {MAX_DEPTH} levels deep")


def _strings(document: Any) -> list[str]:
    found, stack = [], [document]
    while stack:
        value = stack.pop()
        if isinstance(value, str):
            found.append(value)
        elif isinstance(value, dict):
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
    return found


def _depth(document: Any) -> int:
    """Levels of lists and objects in parsed JSON (a scalar has none), without recursion."""
    deepest, stack = 0, [(document, 0)]
    while stack:
        value, level = stack.pop()
        if isinstance(value, (dict, list)):
            deepest = max(deepest, level + 1)
            stack.extend((child, level + 1) for child in (value.values() if isinstance(value, dict) else value))
    return deepest


__all__ = ["MAX_DEPTH", "ALIAS_BUDGET", "NestingError", "yaml_document", "check_yaml", "bounded_yaml_loader",
           "json_document"]

"""The front of `layerdrop pretrain`: what it can answer before Lightning is imported.

    layerdrop pretrain --help                               # the parser's help, kept per code version
    layerdrop pretrain --config r.yaml --trainer.max_stepz 5   # "did you mean 'trainer.max_steps'?"
    layerdrop pretrain --config r.yaml --trainer.max_steps 10 --model.lr_schedule.warmup_steps 10

Importing Lightning and the model stack costs seconds (4.3x a bare ``import torch`` on an
idle core), which every mistake used to pay before its one line. Here the command line is
read as a recipe — the ``--config`` files in order, then each ``--section.key value`` —
and checked with what needs no Lightning: every key against the parser's keys
(framework/recipes/recipe_keys.py, the check `layerdrop sweep` makes, with its "did you
mean"), then the settings that fail together (framework/training/run_checks.py: warmup vs
run length). Anything it cannot read (a value only jsonargparse understands, a recipe that
is not a mapping) it leaves to the full parser, which checks everything again: this front
only answers early, it never accepts what the parser would refuse.
"""

from __future__ import annotations

import math
import shutil
import sys
from typing import Any

import yaml

from framework.files.nesting import NestingError, bounded_yaml_loader, yaml_document
from framework.recipes.parser_cache import cached

PROG = "layerdrop pretrain"
# Arguments of the parser that are not recipe keys.
_NOT_KEYS = {"config", "print_config", "help"}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    answer = quick_answer(argv)
    if answer is not None:
        return answer
    from framework.training.pretrain import main as pretrain_main  # Lightning, the model stack

    return pretrain_main(argv)


def quick_answer(argv: list[str]) -> int | None:
    """The exit status when the command line is answered here, else None."""
    if argv in (["-h"], ["--help"]):  # with a --config, the parser's help shows that recipe's defaults
        print(help_text(), end="")
        return 0
    try:
        refuse_hostile_yaml(argv)
    except NestingError as error:
        print(f"error: {error}; see {PROG} --help", file=sys.stderr)
        return 2
    try:
        settings = read_command_line(argv)
    except _Unreadable:
        return None
    try:
        refuse_unknown_keys(settings)
        check_values(settings["values"])
    except ValueError as error:
        print(f"error: {error}; see {PROG} --help", file=sys.stderr)
        return 2
    return None


def help_text() -> str:
    width = shutil.get_terminal_size().columns
    name = f"help-{width}.txt"

    def build() -> str:
        from framework.recipes.recipe_keys import pretrain_parser

        return pretrain_parser().format_help()

    return cached(name, build)


def refuse_hostile_yaml(argv: list[str]) -> None:
    """``NestingError`` for a ``--config`` file or a value (jsonargparse reads each value as
    YAML, and a value naming a file as that file) nested too deep or whose aliases expand
    too far (framework/files/nesting.py). Checked on every argument before anything else
    reads one: a command line this front leaves to the parser would reach jsonargparse,
    which builds the whole expansion (pretrain bounds its loader too, for files named inside
    a recipe)."""
    for index, arg in enumerate(argv):
        name, has_value, value = arg[2:].partition("=") if arg.startswith("--") else ("", True, arg)
        if not has_value:
            continue
        if not name and index > 0 and argv[index - 1].startswith("--"):
            name = argv[index - 1][2:]
        text = _file_text(value) if name == "config" or value.endswith((".yaml", ".yml", ".json")) else None
        where = f"--{name} {value!r}" if name else repr(value)
        try:
            bounded_yaml_loader(yaml.safe_load, where)(value if text is None else text)
        except yaml.YAMLError:
            continue  # not YAML: for the parser to refuse


def _file_text(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except (OSError, UnicodeDecodeError):
        return None


class _Unreadable(Exception):
    """A command line this front does not read; the full parser will."""


def read_command_line(argv: list[str]) -> dict[str, Any]:
    """``{"keys": [(dotted key, where)], "values": nested dict}`` from the ``--config``
    files (in order) and the ``--key value`` overrides after them."""
    keys: list[tuple[str, str]] = []
    values: dict[str, Any] = {}
    index = 0
    while index < len(argv):
        arg = argv[index]
        if not arg.startswith("--"):
            raise _Unreadable(arg)
        name, has_value, value = arg[2:].partition("=")
        if name == "print_config":
            index += 1
            continue
        if not has_value:
            if index + 1 >= len(argv):
                raise _Unreadable(arg)
            value, index = argv[index + 1], index + 1
        index += 1
        name = name.rstrip("+")  # --trainer.callbacks+=Class appends
        if name == "config":
            recipe = _load(value)
            keys.extend((key, value) for key in _flat_keys(recipe))
            _merge(values, recipe)
        else:
            keys.append((name, "the command line"))
            _set(values, name.split("."), _scalar(value))
    _prefer_command_line(values, {key for key, where in keys if where == "the command line"})
    return {"keys": keys, "values": values}


def _prefer_command_line(values: dict[str, Any], given: set[str]) -> None:
    """As `pretrain` does: a warmup given on the command line replaces the recipe's other form."""
    schedule = values.get("model", {}).get("lr_schedule") if isinstance(values.get("model"), dict) else None
    if not isinstance(schedule, dict):
        return
    steps, fraction = "model.lr_schedule.warmup_steps" in given, "model.lr_schedule.warmup_fraction" in given
    if steps and not fraction:
        schedule["warmup_fraction"] = 0.0
    elif fraction and not steps:
        schedule["warmup_steps"] = 0


def refuse_unknown_keys(settings: dict[str, Any]) -> None:
    from framework.recipes.recipe_keys import recipe_keys

    keys = recipe_keys()
    for key, where in settings["keys"]:
        if key in _NOT_KEYS:
            continue
        parts = key.split(".")
        if any(".".join(parts[:size]) in keys.leaves for size in range(1, len(parts))):
            continue  # below a value (a callback's init args after --trainer.callbacks+=)
        problem = keys.problem(key)
        if problem is not None:
            raise ValueError(problem if where == "the command line" else f"{where}: {problem}")


def check_values(values: dict[str, Any]) -> None:
    """The run-length checks on what the recipe and the overrides say (what they leave
    unset is the parser's default, checked later). Any positive whole number of steps is
    a run length: 10^12 is accepted (nothing is sized by it; the first progress line's
    ETA says what it means), as Lightning accepts it."""
    from framework.training.run_checks import check_warmup

    trainer = values.get("trainer") if isinstance(values.get("trainer"), dict) else {}
    max_steps = trainer.get("max_steps")
    if max_steps is None:
        return
    if isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1:
        written = _whole_number(max_steps)
        if written is not None:  # 1e12: YAML reads it as text, jsonargparse as a float; steps are counted
            raise ValueError(f"trainer.max_steps={max_steps!r} is invalid: a whole number of optimizer steps, "
                             f"written in digits ({written})")
        raise ValueError(f"trainer.max_steps={max_steps!r} is invalid: pretraining needs the run length; set a "
                         "positive --trainer.max_steps")
    model = values.get("model") if isinstance(values.get("model"), dict) else {}
    schedule = model.get("lr_schedule")
    if isinstance(schedule, dict):
        try:
            check_warmup(schedule, max_steps)
        except TypeError:  # a key or value the parser reads its own way
            return


def _whole_number(value: Any) -> int | None:
    """A positive whole number written another way (``1e12``, ``300.0``), else None."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return int(number) if math.isfinite(number) and number >= 1 and number == int(number) else None


def _load(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as handle:
            recipe = yaml_document(handle.read(), f"--config {path!r}")
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as error:
        raise _Unreadable(path) from error
    if not isinstance(recipe, dict):
        raise _Unreadable(path)
    return recipe


def _flat_keys(recipe: dict[str, Any], prefix: str = "") -> list[str]:
    """Dotted keys of a recipe; a mapping with ``class_path`` is a value, not a section."""
    found = []
    for key, value in recipe.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict) and value and "class_path" not in value:
            found.extend([dotted] if not _is_section(dotted) else _flat_keys(value, f"{dotted}."))
        else:
            found.append(dotted)
    return found


def _is_section(key: str) -> bool:
    from framework.recipes.recipe_keys import recipe_keys

    return key in recipe_keys().sections


def _merge(into: dict[str, Any], recipe: dict[str, Any]) -> None:
    for key, value in recipe.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value


def _set(into: dict[str, Any], parts: list[str], value: Any) -> None:
    for part in parts[:-1]:
        if not isinstance(into.get(part), dict):
            into[part] = {}
        into = into[part]
    into[parts[-1]] = value


def _scalar(text: str) -> Any:
    """A command-line value as jsonargparse reads a number, a bool or null (YAML)."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


__all__ = ["main", "quick_answer", "help_text", "refuse_hostile_yaml", "read_command_line", "refuse_unknown_keys",
           "check_values"]

"""lm-eval task names, checked in a second instead of lm-eval's ~30 s index.

lm-eval's TaskManager parses all ~14k built-in YAML files (with their includes) before
it can say whether a name exists. Checking names goes in two steps:

1. a quick scan: the top-level ``task:``, ``group:`` and ``tag:`` declarations of the
   YAML files, read as text (about a second); a name declared there exists;
2. a name the scan does not find (one that a YAML inherits through an include) is
   looked up in lm-eval's own index, built once and cached per lm-eval version in
   ``$XDG_CACHE_HOME/layerdrop`` (or ~/.cache/layerdrop): an unknown name is refused
   in ~30 s the first time, instantly afterwards.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
import re
import sys
from pathlib import Path
from typing import Iterable, Sequence

from framework.files.atomic_write import write_text
from framework.files.nesting import json_document

_KEY = re.compile(r"^(task|group|tag|class)\s*:\s*(.*?)\s*$")
_ITEM = re.compile(r"^\s+-\s*([^\s#]+)")
_IGNORED = {"__pycache__", ".ipynb_checkpoints"}


def declared_names(folder: Path) -> set[str]:
    """Names the YAML files under ``folder`` declare at their top level (no includes)."""
    names: set[str] = set()
    for path in folder.rglob("*.yaml"):
        if _IGNORED & set(path.parts):
            continue
        try:
            lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            continue
        names |= _file_names(lines)
    return names


def _file_names(lines: list[str]) -> set[str]:
    """The names lm-eval's index takes from one file: a group's (any ``group:`` without
    ``class:``), else a task's (``task: x``) and its tags."""
    scalars: dict[str, str] = {}
    tags: list[str] = []
    for number, line in enumerate(lines):
        match = _KEY.match(line)
        if not match:
            continue
        key, value = match.group(1), match.group(2).split(" #")[0].strip().strip("'\"")
        if key == "tag":
            if value.startswith("["):
                tags += [v.strip().strip("'\"") for v in value.strip("[]").split(",") if v.strip()]
            elif value:
                tags.append(value)
            else:
                for follow in lines[number + 1:]:
                    item = _ITEM.match(follow)
                    if not item:
                        break
                    tags.append(item.group(1).strip("'\""))
        elif value and not value.startswith(("[", "!")):
            scalars[key] = value
        else:
            scalars.setdefault(key, "")
    if "group" in scalars and "class" not in scalars:  # a group (lm-eval keeps none of its tags)
        return {scalars["group"]} - {""}
    if scalars.get("task"):  # a task, or a Python-class task
        return {scalars["task"], *tags} - {""}
    return set()


def builtin_folder() -> Path:
    import lm_eval.tasks

    return Path(lm_eval.tasks.__file__).parent


def _cache_file() -> Path:
    import lm_eval

    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "layerdrop"
    version = getattr(lm_eval, "__version__", "unknown")
    # One per installation, the same in every process (``hash`` of a str is salted per process).
    tag = hashlib.sha256(str(builtin_folder()).encode()).hexdigest()[:12]
    return root / f"lm_eval_tasks-{version}-{tag}.json"


def builtin_index() -> set[str]:
    """Every built-in name lm-eval's own index knows (built once, then cached)."""
    cache = _cache_file()
    if cache.is_file():
        try:
            return set(json_document(cache.read_text(), str(cache)))
        except (OSError, ValueError, TypeError):  # unreadable, not JSON, too deep, not a list: index again
            pass
    from lm_eval.tasks import TaskManager

    print(f"indexing lm-eval's built-in tasks once (~30 s; cached in {cache})", file=sys.stderr)
    names = set(TaskManager(include_defaults=True).all_tasks)
    try:
        write_text(cache, json.dumps(sorted(names)))
    except OSError:
        pass  # a read-only home: the next run indexes again
    return names


def local_names(include_paths: Iterable[str]) -> set[str]:
    """Names under the include paths, from lm-eval's index of just those folders."""
    paths = list(include_paths)
    if not paths:
        return set()
    from lm_eval.tasks import TaskManager

    return set(TaskManager(include_path=paths, include_defaults=False).all_tasks)


def check_tasks(names: Sequence[str], include_paths: Sequence[str], builtin: bool,
                paper_tasks: Sequence[str] = (), packaged: Sequence[str] = ()) -> None:
    """Refuse (ValueError, one line) any name that is no task, group or tag. ``packaged``:
    the names that need no index (they are named among the allowed ones)."""
    for path in include_paths:
        if not Path(path).is_dir():
            raise ValueError(f"--include-path {path!r} is not a folder of task YAMLs")
    known = local_names(include_paths)
    missing = [n for n in names if n not in known and n not in packaged]
    quick: set[str] = set()
    if missing and builtin:
        quick = declared_names(builtin_folder())
        missing = [n for n in missing if n not in quick]
    full: set[str] = set()
    if missing and builtin:
        full = builtin_index()
        missing = [n for n in missing if n not in full]
    if not missing:
        return
    pool = known | quick | full | set(packaged) | {"paper"}
    hints = []
    for name in missing:
        close = difflib.get_close_matches(name, pool, n=3, cutoff=0.75)
        hints.append(f"{name!r}" + (f" (did you mean {', '.join(close)}?)" if close else ""))
    offline = f"the packaged tasks ({','.join(packaged)})" if packaged else ""
    if builtin:
        allowed = (f"'paper' ({','.join(paper_tasks)}), {offline + ', ' if offline else ''}one of lm-eval's "
                   f"{len(pool)} task/group/tag names (list them with `lm-eval ls tasks`) or a task under "
                   "--include-path")
    else:
        allowed = (f"'paper', {offline + ', ' if offline else ''}or a task under --include-path: "
                   f"{', '.join(sorted(known)) or '(none found)'}")
    raise ValueError(f"unknown task {', '.join(hints)}; allowed: {allowed}")


__all__ = ["declared_names", "builtin_folder", "builtin_index", "local_names", "check_tasks"]

"""Resuming a run: which checkpoint (``--resume auto`` or a path), checked before any
library reads it, and the recipe's optimizer settings over the saved ones.

``--resume auto`` looks at ``<checkpoint dir>``: the ``step-N.ckpt`` entries and
``last.ckpt``, newest step first, and takes the first that is complete:

    single file      a whole zip archive (torch.save writes the zip directory last)
    FSDP2 (DCP)      .metadata + meta.pt, and every shard file as long as .metadata says
    DeepSpeed        the ``latest`` tag, its folder, the model states and one optimizer
                     state file per rank, each a whole archive

An incomplete one (left by another tool, or damaged: the saves themselves never leave
one under a final name, see framework/checkpoint_folder.py) is skipped. The one taken
is then proven harmless (``framework.safe_unpickle.prove_checkpoint_harmless``: no file
of it can run code when a library unpickles it); a refusal stops the run, it is
never skipped over. Leftovers of interrupted saves are removed first. One line says
what was chosen.
"""

from __future__ import annotations

import re
import warnings
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from framework.checkpoint_folder import LAST, STEP_NAME, clean_leftovers, step_checkpoints

DCP_METADATA = ".metadata"
LIGHTNING_META = "meta.pt"  # ModelParallelStrategy's non-tensor entries beside the shards
_ZERO_OPTIM = re.compile(r"^(?:bf16_)?zero_pp_rank_(\d+)_mp_rank_\d+_optim_states\.pt$")


@dataclass
class ResumeChoice:
    """The checkpoint to continue from (None: start fresh) and what to say about it."""

    path: str | None
    step: int | None = None
    skipped: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)

    def message(self, folder: Path) -> str:
        if self.path is None:
            said = f"resume: no complete checkpoint in {folder}, starting from step 0"
        else:
            said = f"resume: continuing from {self.path} (step {self.step})"
        if self.skipped:
            said += f"; skipped {', '.join(self.skipped)}"
        if self.removed:
            said += f"; removed {len(self.removed)} leftover(s) of interrupted saves ({', '.join(self.removed)})"
        return said


def choose_checkpoint(resume: str | None, folder: Path, *, clean: bool = True) -> ResumeChoice | None:
    """None without --resume; else the checkpoint ``--resume`` names ("auto": the newest
    complete one in ``folder``), checked complete and proven harmless. ``clean``: remove
    staging leftovers (global rank 0 only). Raises ValueError / CheckpointError."""
    if resume is None or resume == "":
        return None
    if resume != "auto":
        path = Path(resume)
        if not path.exists():
            raise ValueError(f"--resume {resume!r} is invalid: no such checkpoint (use 'auto' or an existing "
                             "checkpoint file or folder)")
        reason = incomplete_reason(path)
        if reason:
            raise _checkpoint_error(f"checkpoint {str(path)!r} is incomplete: {reason}")
        _prove_harmless(path)
        return ResumeChoice(str(path), _step_of(path.resolve()))
    removed = clean_leftovers(folder) if clean else []
    skipped: list[str] = []
    for step, path in _candidates(folder, skipped):
        reason = incomplete_reason(path)
        if reason:
            skipped.append(f"{path.name} ({reason})")
            continue
        _prove_harmless(path)
        return ResumeChoice(str(path), step, skipped, removed)
    return ResumeChoice(None, None, skipped, removed)


def _candidates(folder: Path, skipped: list[str]) -> list[tuple[int, Path]]:
    """(step, path), newest first; last.ckpt only where it is not a link to a step-N."""
    found = step_checkpoints(folder)
    last = folder / LAST
    if last.is_symlink():
        target = last.resolve()
        match = STEP_NAME.match(target.name)
        if target.exists() and match and target.parent != folder.resolve():
            found.append((int(match[1]), target))  # a link into another folder
    elif last.exists():  # a real last.ckpt (an earlier layout): its step is in its metadata
        reason = incomplete_reason(last)
        if reason:
            skipped.append(f"{LAST} ({reason})")
        else:
            _prove_harmless(last)
            step = _step_of(last)
            found.append((step if step is not None else -1, last))
    # Newest step first; a step-N name before a last.ckpt of the same step.
    return sorted(found, key=lambda item: (item[0], item[1].name != LAST), reverse=True)


def incomplete_reason(path: Path) -> str | None:
    """Why ``path`` is not a complete checkpoint, from file names and sizes (and a DCP
    .metadata read by the restricted unpickler); None when it is complete."""
    if path.is_file():
        return _archive_reason(path, named=False)
    if not path.is_dir():
        return "neither a file nor a folder"
    if (path / DCP_METADATA).exists() or (path / LIGHTNING_META).exists():
        for name in (DCP_METADATA, LIGHTNING_META):
            if not (path / name).is_file():
                return f"no {name}"
        return _archive_reason(path / LIGHTNING_META) or _shards_missing(path)
    if (path / "latest").is_file():
        return _deepspeed_reason(path)
    return "not a training checkpoint folder (no .metadata, meta.pt or DeepSpeed 'latest')"


def _archive_reason(path: Path, named: bool = True) -> str | None:
    """torch.save writes a zip archive whose central directory comes last: a file that
    opens as a zip archive was written to the end."""
    try:
        with zipfile.ZipFile(path) as archive:
            archive.infolist()
    except (zipfile.BadZipFile, OSError, ValueError):
        return f"{path.name + ' ' if named else ''}cut short at {path.stat().st_size} bytes"
    return None


def _deepspeed_reason(path: Path) -> str | None:
    from framework.checkpoint import CheckpointError
    from framework.zero_checkpoint import model_states_file, tag_folder

    try:
        folder = tag_folder(path)
        model_states_file(path)
    except CheckpointError as err:
        return str(err)
    ranks = sorted(int(m[1]) for entry in folder.iterdir() if (m := _ZERO_OPTIM.match(entry.name)))
    if not ranks or ranks != list(range(len(ranks))):
        return f"optimizer state files of ranks {ranks} (expected 0..n-1)"
    for entry in sorted(folder.glob("*.pt")):
        reason = _archive_reason(entry)
        if reason:
            return reason
    return None


def _shards_missing(path: Path) -> str | None:
    """A DCP folder's shard files against the sizes its .metadata gives them (read by
    the restricted unpickler: .metadata is a pickle)."""
    from framework.safe_unpickle import load_dcp_metadata

    needed: dict[str, int] = {}
    for info in (load_dcp_metadata(path / DCP_METADATA).storage_data or {}).values():
        needed[info.relative_path] = max(needed.get(info.relative_path, 0), info.offset + info.length)
    for name, size in sorted(needed.items()):
        shard = path / name
        have = shard.stat().st_size if shard.is_file() else 0
        if have < size:
            return f"shard {name} holds {have} of {size} bytes"
    return None


def _prove_harmless(path: Path) -> None:
    from framework.safe_unpickle import prove_checkpoint_harmless

    prove_checkpoint_harmless(path)


def _checkpoint_error(message: str) -> Exception:
    from framework.checkpoint import CheckpointError

    return CheckpointError(message)


def _step_of(path: Path) -> int | None:
    match = STEP_NAME.match(path.name)
    if match:
        return int(match[1])
    from framework.checkpoint import read_metadata

    step = read_metadata(path).get("global_step")
    return int(step) if isinstance(step, int) else None


# ------------------------------------------------- optimizer settings on resume

_SHOWN = {"lr": "lr", "initial_lr": "peak lr", "weight_decay": "weight_decay", "eps": "eps", "betas": "betas"}


def apply_recipe_optimizer_settings(module: Any, checkpoint: dict[str, Any]) -> str | None:
    """Put the recipe's optimizer settings into the state being resumed: the learning
    rate of every group at the resumed step (its peak LR × the recipe's schedule), the
    weight decay, ε and betas, and the scheduler's base LRs.

    torch restores them from the checkpoint (``Optimizer.load_state_dict`` takes the
    saved groups' values), so a lower LR after a divergence would be silently ignored.
    The saved optimizer state is patched before Lightning loads it; strategies that
    load the optimizer themselves before this hook (FSDP2, DeepSpeed) are patched live.
    Returns (and prints on rank 0) the one line saying what changed, None when nothing did.
    """
    optimizer, scheduler = _fresh_optimizer(module)
    schedulers = checkpoint.get("lr_schedulers") or []
    step = schedulers[0].get("last_epoch") if schedulers else None
    step = int(step) if isinstance(step, int) else int(checkpoint.get("global_step", 0))
    recipe = _settings_at(optimizer, scheduler, step)
    changes: dict[str, list[str]] = {}
    saved = [state["param_groups"] for state in (checkpoint.get("optimizer_states") or [])[:1]]
    live = [module.trainer.optimizers[0].param_groups] if module.trainer.optimizers else []
    for groups in saved + live:
        _overwrite(groups, recipe, changes)
    for state in schedulers[:1]:
        if "base_lrs" in state:
            state["base_lrs"] = [group["initial_lr"] for group in recipe]
        if "_last_lr" in state:
            state["_last_lr"] = [group["lr"] for group in recipe]
    if not changes:
        return None
    line = ("resume: the recipe's optimizer settings replace the checkpoint's: "
            + "; ".join(f"{key} {', '.join(items)}" for key, items in changes.items()))
    if module.trainer.is_global_zero:
        print(line, flush=True)
    return line


def _fresh_optimizer(module: Any) -> tuple[Any, Any]:
    """What ``configure_optimizers`` builds for this run (the recipe's settings)."""
    configured = module.configure_optimizers()
    if isinstance(configured, dict):
        scheduler = configured.get("lr_scheduler")
        scheduler = scheduler.get("scheduler") if isinstance(scheduler, dict) else scheduler
        return configured["optimizer"], scheduler
    return configured, None


def _settings_at(optimizer: Any, scheduler: Any, step: int) -> list[dict[str, Any]]:
    """Every group's settings with the learning rate the recipe's schedule gives at ``step``."""
    groups = [{key: group[key] for key in ("weight_decay", "eps", "betas") if key in group}
              | {"initial_lr": group.get("initial_lr", group["lr"]), "lr": group["lr"],
                 "name": group.get("name")}
              for group in optimizer.param_groups]
    if scheduler is not None:
        scheduler.last_epoch = step
        with warnings.catch_warnings():  # get_lr() outside step() warns; LambdaLR's is closed-form
            warnings.simplefilter("ignore")
            for group, lr in zip(groups, scheduler.get_lr()):
                group["lr"] = lr
    return groups


def _overwrite(groups: list[dict[str, Any]], recipe: list[dict[str, Any]], changes: dict[str, list[str]]) -> None:
    """Write ``recipe`` into ``groups`` (matched by name); note each change once."""
    by_name = {group["name"]: group for group in recipe if group.get("name") is not None}
    changed: dict[tuple[str, str, str], list[str]] = {}
    for index, group in enumerate(groups):
        wanted = by_name.get(group.get("name")) or (recipe[index] if index < len(recipe) else None)
        if wanted is None:
            continue
        for key, shown in _SHOWN.items():
            if key in wanted and not _same(group.get(key), wanted[key]):
                changed.setdefault((shown, _fmt(group.get(key)), _fmt(wanted[key])), []).append(
                    str(group.get("name") or f"group {index}"))
                group[key] = wanted[key]
    for (shown, old, new), names in changed.items():
        where = "every group" if len(names) == len(groups) > 1 else ", ".join(names)
        note = f"{old} -> {new} ({where})"
        if note not in changes.setdefault(shown, []):
            changes[shown].append(note)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return tuple(a) == tuple(b)
    return a == b


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (tuple, list)):
        return "(" + ", ".join(_fmt(v) for v in value) + ")"
    return str(value)


__all__ = ["ResumeChoice", "choose_checkpoint", "incomplete_reason", "apply_recipe_optimizer_settings"]

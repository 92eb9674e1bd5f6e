"""Resuming a run: which checkpoint (``--resume auto`` or a path), checked before any
library reads it, and the recipe's optimizer settings over the saved ones.

``--resume auto`` looks at ``<checkpoint dir>``: the ``step-N.ckpt`` entries and
``last.ckpt``, newest step first, and takes the first that is complete (each form
says what complete means: ``Form.incomplete_reason`` in framework/checkpoint/forms.py's
modules). An incomplete one (left by another tool, or damaged: the saves themselves
never leave one under a final name, see framework/checkpoint/folder.py) is skipped.
The one taken is then opened (framework/checkpoint/loader.py): proven harmless, no
file of it can run code when a library unpickles it; a refusal stops the run, it is
never skipped over. Leftovers of interrupted saves are removed first. One line says
what was chosen.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from framework.checkpoint.base import CheckpointError
from framework.checkpoint.folder import LAST, STEP_NAME, clean_leftovers, step_checkpoints
from framework.checkpoint.forms import FORMS
from framework.checkpoint.loader import Checkpoint


class WorldSizeError(ValueError):
    """A refusal that follows from the world size and what every rank shares (the recipe,
    the checkpoint's record): raised alike on every rank, so printed once, by rank 0."""


@dataclass
class ResumeChoice:
    """The checkpoint to continue from (None: start fresh) and what to say about it."""

    path: str | None
    step: int | None = None
    skipped: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    checkpoint: Checkpoint | None = None  # opened: proven harmless, metadata read

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
            raise CheckpointError(f"checkpoint {str(path)!r} is incomplete: {reason}")
        opened = Checkpoint.open(path)
        return ResumeChoice(str(path), _step_of(opened, path.resolve()), checkpoint=opened)
    removed = clean_leftovers(folder) if clean else []
    skipped: list[str] = []
    for step, path, opened in _candidates(folder, skipped):
        reason = incomplete_reason(path)
        if reason:
            skipped.append(f"{path.name} ({reason})")
            continue
        return ResumeChoice(str(path), step, skipped, removed, opened or Checkpoint.open(path))
    return ResumeChoice(None, None, skipped, removed)


def _candidates(folder: Path, skipped: list[str]) -> list[tuple[int, Path, Checkpoint | None]]:
    """(step, path, the checkpoint if it was opened to find its step), newest first;
    last.ckpt only where it is not a link to a step-N."""
    found: list[tuple[int, Path, Checkpoint | None]] = [(step, path, None) for step, path in step_checkpoints(folder)]
    last = folder / LAST
    if last.is_symlink():
        target = last.resolve()
        match = STEP_NAME.match(target.name)
        if target.exists() and match and target.parent != folder.resolve():
            found.append((int(match[1]), target, None))  # a link into another folder
    elif last.exists():  # a real last.ckpt (an earlier layout): its step is in its metadata
        reason = incomplete_reason(last)
        if reason:
            skipped.append(f"{LAST} ({reason})")
        else:
            opened = Checkpoint.open(last)
            step = _step_of(opened, last)
            found.append((step if step is not None else -1, last, opened))
    # Newest step first; a step-N name before a last.ckpt of the same step.
    return sorted(found, key=lambda item: (item[0], item[1].name != LAST), reverse=True)


def incomplete_reason(path: Path) -> str | None:
    """Why ``path`` is not a complete training checkpoint, from file names and sizes
    (and a DCP .metadata read by the restricted unpickler); None when it is complete."""
    if not path.is_file() and not path.is_dir():
        return "neither a file nor a folder"
    form = next((form for form in FORMS if form.detect(path)), None)
    if form is None or form.self_contained:  # an export holds no optimizer state to resume
        return "not a training checkpoint folder (no .metadata, meta.pt or DeepSpeed 'latest')"
    return form.incomplete_reason(path)


def _step_of(opened: Checkpoint, path: Path) -> int | None:
    match = STEP_NAME.match(path.name)
    if match:
        return int(match[1])
    step = opened.metadata.get("global_step")
    return int(step) if isinstance(step, int) else None


# ------------------------------------------------------ the world it ran on


def world_of(trainer: Any) -> dict[str, Any]:
    """What a checkpoint records of the processes that wrote it (checked on resume)."""
    return {"processes": trainer.world_size, "strategy": type(trainer.strategy).__name__,
            "accumulate_grad_batches": trainer.accumulate_grad_batches}


# Strategies whose checkpoints are DCP folders: torch.distributed.checkpoint reshards
# the model and optimizer state onto any number of processes when they are loaded.
RESHARDABLE = ("FSDP2Strategy", "HSDPStrategy", "ModelParallelStrategy")
# One process reads such a folder whole (framework/checkpoint/sharded/dcp_reader.py).
ONE_PROCESS = ("SingleDeviceStrategy",)


def check_same_world(saved: Any, trainer: Any) -> None:
    """A resume on another number of processes: an FSDP2/HSDP run (a DCP folder) goes on
    under fsdp/hsdp with its state resharded, or under single with it gathered whole;
    gradient accumulation is set to keep the global batch (one line says so). Anything
    else is refused in one line (DDP files and DeepSpeed folders are not resharded). A
    checkpoint from before this record passes."""
    if not isinstance(saved, dict) or not isinstance(saved.get("processes"), int):
        return
    was, now = saved["processes"], trainer.world_size
    if was == now:
        return
    strategies = (saved.get("strategy"), type(trainer.strategy).__name__)
    if strategies[0] not in RESHARDABLE or strategies[1] not in RESHARDABLE + ONE_PROCESS:
        raise WorldSizeError(
            f"the checkpoint was written by {was} processes ({strategies[0]}) and this run has {now} "
            f"({strategies[1]}): only an FSDP2/HSDP checkpoint (a DCP folder) resumed under fsdp, hsdp or single is "
            f"resharded; resume on {was} processes (--trainer.devices x --trainer.num_nodes), or start a new run "
            "from its weights (--model.init_from CHECKPOINT)")
    rows = saved.get("accumulate_grad_batches", 1) * was  # micro-batches per optimizer step, all ranks
    if rows % now:
        raise WorldSizeError(
            f"the checkpoint's global batch is {rows} micro-batches ({was} processes x "
            f"{saved.get('accumulate_grad_batches', 1)} accumulated) and {now} processes cannot keep it "
            f"(no whole gradient accumulation): resume on a number of processes that divides {rows}")
    how = "gathered whole from the DCP shards" if strategies[1] in ONE_PROCESS else "resharded by DCP"
    if trainer.accumulate_grad_batches != rows // now and trainer.is_global_zero:
        print(f"resume: {was} -> {now} processes: gradient accumulation {trainer.accumulate_grad_batches} -> "
              f"{rows // now} keeps the global batch of {rows} micro-batches; model and optimizer {how}",
              flush=True)
    trainer.accumulate_grad_batches = rows // now


def check_form_fits(checkpoint: Any, strategy: Any) -> None:
    """A folder of shards resumed under a strategy that cannot read it is one line
    before anything is built (Lightning's single-device load would open the folder as
    a file). ``strategy``: the recipe's trainer.strategy (a name, or anything else)."""
    form = getattr(getattr(checkpoint, "form", None), "name", None)
    if isinstance(strategy, str):
        name = strategy
    else:  # a class path given in the recipe, or a strategy object
        path = strategy.get("class_path") if isinstance(strategy, dict) else getattr(strategy, "class_path", None)
        name = str(path or type(strategy).__name__)
    fits, written, under = {
        "dcp": (("fsdp", "hsdp", "FSDP2", "HSDP", "ModelParallel", "single", "SingleDevice"),
                "an FSDP2/HSDP folder (DCP)", "fsdp or hsdp (on any number of processes) or single"),
        "deepspeed": (("deepspeed", "DeepSpeed"), "a DeepSpeed folder", "the DeepSpeed stage that wrote it"),
    }.get(form, ((), "", ""))
    if not fits or any(word in name for word in fits):
        return
    raise ValueError(f"checkpoint {str(checkpoint.path)!r} is {written}, which trainer.strategy={name!r} cannot "
                     f"resume: resume it under {under}, or start a new run from its weights "
                     "(--model.init_from CHECKPOINT)")


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


__all__ = ["ResumeChoice", "WorldSizeError", "choose_checkpoint", "incomplete_reason",
           "apply_recipe_optimizer_settings", "world_of",
           "check_same_world", "check_form_fits"]

"""A recipe checked as a whole before any model is built: the settings that only fail
together (warmup vs run length, validation cadence vs run length and epoch, sequence
length vs the prepared splits), each refused in one line naming the flag to change.

    check_run(config)                   # in `layerdrop pretrain`, before the model is built
    check_run(config, printing=True)    # under --print_config: the same checks, without notes

Lightning would find some of these only after the model summary (``val_check_interval``
longer than an epoch), and the LR schedule only when the optimizer is configured. A
``val_check_interval`` longer than the whole run would never validate: it becomes the
run's length (validation once, at the end), and a note says so.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from framework.training.lr_schedule import LRScheduleConfig
from framework.files.staging import is_url


def check_run(config: Any, *, printing: bool = False) -> None:
    """Raise ValueError (one line) for settings that cannot run together. The checks
    against the data run when its folder is on this machine (a missing or remote one is
    named by the data module when the run sets it up) and for every mixture (each of its
    folders is read now); ``printing``: no notes."""
    max_steps = config.trainer.max_steps
    check_warmup(config.model.lr_schedule, max_steps)
    clamp_validation(config.trainer, max_steps, quiet=printing)
    data = _as_dict(config.data)
    if data.get("mixture") is not None:
        check_data(config)  # every source, local or remote: a mixture is refused whole before a step
        return
    data_dir = str(data.get("data_dir"))
    if not is_url(data_dir) and os.path.isfile(os.path.join(data_dir, "manifest.json")):
        check_data(config)


def check_warmup(lr_schedule: Any, max_steps: int) -> None:
    cfg = LRScheduleConfig(**_as_dict(lr_schedule))
    warmup = cfg.warmup_for(max_steps)
    if warmup >= max_steps:
        given = f"model.lr_schedule.warmup_fraction={cfg.warmup_fraction}" if cfg.warmup_fraction \
            else f"model.lr_schedule.warmup_steps={warmup}"
        raise ValueError(f"{given} is invalid: the warmup must be shorter than trainer.max_steps={max_steps}; "
                         "set --model.lr_schedule.warmup_steps or --model.lr_schedule.warmup_fraction")


def clamp_validation(trainer: Any, max_steps: int, *, quiet: bool = False) -> None:
    interval = trainer.val_check_interval
    if isinstance(interval, bool) or not isinstance(interval, int) or interval <= max_steps:
        return
    trainer.val_check_interval = max_steps
    if not quiet:
        print(f"note: trainer.val_check_interval={interval} is longer than the run (trainer.max_steps={max_steps}): "
              f"validating once, at step {max_steps}", file=sys.stderr, flush=True)


def check_data(config: Any) -> None:
    """The data module's own checks (manifest, vocabulary, sequences per split), now,
    then a validation cadence that fits one pass over the train split."""
    from framework.training.data import TokenDataModule

    data = TokenDataModule(**_as_dict(config.data))
    data.setup()
    trainer = config.trainer
    interval = trainer.val_check_interval
    if isinstance(interval, bool) or not isinstance(interval, int) or trainer.check_val_every_n_epoch is None:
        return
    if data.sources is not None:
        return  # a mixture's sources cycle on their own: no epoch to fit the cadence in
    world = _count(trainer.devices) * _count(trainer.num_nodes)
    epoch = data.blocks("train") // (data.batch_size * world)
    limit = trainer.limit_train_batches
    if isinstance(limit, int) and not isinstance(limit, bool):
        epoch = min(epoch, limit)
    if interval > epoch:
        raise ValueError(f"trainer.val_check_interval={interval} is invalid: one pass over the train split of "
                         f"{data.data_dir} is {epoch} batches (of {data.batch_size} x {world} sequences); set "
                         f"--trainer.val_check_interval <= {epoch}, or prepare more data")


def prefer_command_line(lr_schedule: Any, argv: list[str]) -> None:
    """A warmup given on the command line replaces the recipe's other warmup form
    (``--model.lr_schedule.warmup_steps 1`` over a recipe's ``warmup_fraction``), as any
    later setting replaces an earlier one, instead of being refused as both set."""
    given = {arg.split("=")[0] for arg in argv if isinstance(arg, str)}
    steps, fraction = "--model.lr_schedule.warmup_steps" in given, "--model.lr_schedule.warmup_fraction" in given
    if steps and not fraction:
        lr_schedule.warmup_fraction = 0.0
    elif fraction and not steps:
        lr_schedule.warmup_steps = 0


def split_print_config(argv: list[str]) -> tuple[list[str], dict[str, bool] | None]:
    """``argv`` without ``--print_config[=flags]``, and the flags as ``parser.dump``
    arguments (None when not asked): the config is printed after `check_run`, not by the
    parser before any check."""
    rest, flags = [], None
    names = {"skip_default": "skip_default", "skip_unset": "skip_unset", "comments": "with_comments"}
    for arg in argv:
        if isinstance(arg, str) and (arg == "--print_config" or arg.startswith("--print_config=")):
            flags = {"skip_unset": False, "skip_validation": False}
            for flag in filter(None, arg.partition("=")[2].split(",")):
                if flag not in names:
                    raise ValueError(f"--print_config={flag} is invalid: allowed flags are {', '.join(names)}")
                flags[names[flag]] = True
        else:
            rest.append(arg)
    return rest, flags


def _count(value: Any) -> int:
    """Devices or nodes as a number when the setting gives one (else 1: 'auto', a list)."""
    if isinstance(value, (list, tuple)):
        return max(1, len(value))
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    if isinstance(value, str) and value.isdigit() and int(value) > 0:
        return int(value)
    return 1


def _as_dict(section: Any) -> dict[str, Any]:
    if hasattr(section, "as_dict"):
        return section.as_dict()
    return dict(vars(section)) if not isinstance(section, dict) else dict(section)


__all__ = ["check_run", "check_warmup", "clamp_validation", "check_data", "prefer_command_line", "split_print_config"]

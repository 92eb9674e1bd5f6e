"""`layerdrop pretrain`: LightningCLI ``fit`` of ``LayerDropModule`` on prepared tokens.

    layerdrop pretrain --config recipes/tiny.yaml [--model.layer_dropout.p_max 0.2 ...]
    layerdrop pretrain --config recipes/tiny.yaml --print_config     # the resolved config
    layerdrop pretrain --config recipes/tiny.yaml --resume auto      # continue a run (a finished one: its summary)

Sections of a recipe: ``trainer`` (Lightning's Trainer), ``model`` (LayerDropModule:
decoder, layer_dropout, parametrization, lr_schedule), ``data`` (TokenDataModule),
``checkpoint`` (PeriodicCheckpoint), ``throughput`` (Throughput: peak FLOPs for MFU),
``summary`` (RunSummary), ``guard`` (NonFiniteLossGuard) and ``resume``. A run lives in
``trainer.default_root_dir``:

    <root>/checkpoints/step-XXXXXXXX.ckpt, last.ckpt -> the newest (framework/training/checkpointing/saving.py)
    <root>/lightning_logs/version_N/      TensorBoard events + config.yaml (resolved config)
    <root>/summary.json                   what the run did (also printed at the end)

Everything that can be checked before the first step is checked first, with a one-line
error: a bad flag, recipe key or value, the Trainer settings Lightning would trip over
later, the resume target (framework/checkpoint/resume.py: complete, harmless), the checkpoint's
model shape against the config, the data's vocabulary against the model (the
DataModule's setup), a non-constant dropout schedule without ``max_steps``.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import sys
import warnings
from argparse import ArgumentError
from pathlib import Path
from typing import Any

from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import LearningRateMonitor, ModelSummary, ProgressBar
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.pytorch.utilities.exceptions import SIGTERMException
from lightning.pytorch.utilities.rank_zero import rank_zero_only

from framework.config import PositiveInt, check
from framework.files.disk_space import DiskFull
from framework.files.nesting import bounded_yaml_loader
from framework.files.run_lock import RunFolderInUse, RunLock
from framework.files.staging import is_url
from framework.training.callbacks import Throughput
from framework.training.run_summary import SUMMARY_FILE, RunSummary, format_summary, read_twin
from framework.checkpoint import CKPT_KEY, CheckpointError, read_metadata
from framework.checkpoint.export import EXPORT_FOLDER
from framework.training.checkpointing.final_export import export_callbacks, exported_step
from framework.checkpoint.resume import WorldSizeError, check_form_fits, choose_checkpoint
from framework.training.checkpointing.saving import (PeriodicCheckpoint, refuse_earlier_checkpoints,
                                                     refuse_earlier_run, use_atomic_checkpoint_io)
from framework.training.module import LayerDropModule, check_same_model, with_parametrization
from framework.training.model_summary import FlopCountedSummary
from framework.training.nonfinite import NonFiniteLossError, NonFiniteLossGuard
from framework.training.progress import StepProgressBar, StepProgressLines
from framework.training.leftovers import remove_at_exit_if_unused
from framework.training.run_checks import check_run, prefer_command_line, split_print_config

PROG = "layerdrop pretrain"


class PretrainCLI(LightningCLI):
    """LightningCLI without subcommands (always ``fit``), plus ``--resume`` and the
    run's callbacks as their own config sections."""

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.add_argument("--resume", type=str | None, default=None,
                            help="'auto': continue from the newest complete checkpoint in the checkpoint "
                                 "folder (else start fresh); or the path of a checkpoint to continue from")
        parser.add_argument("--progress_every", type=float | None, default=30.0,
                            help="when stdout is not a terminal (a log file): seconds between progress lines "
                                 "'step N/T, loss, tokens/s, ETA' (0: every step; null: none)")
        # The DataModule checks the prepared vocabulary against the embedding at setup.
        parser.link_arguments("model.decoder.vocab_size", "data.model_vocab_size")
        parser.add_lightning_class_args(PeriodicCheckpoint, "checkpoint")
        parser.add_lightning_class_args(Throughput, "throughput")
        parser.add_lightning_class_args(RunSummary, "summary")
        parser.add_lightning_class_args(NonFiniteLossGuard, "guard")

    def parse_arguments(self, parser: LightningArgumentParser, args: Any) -> None:
        args, print_flags = split_print_config(list(args or []))
        super().parse_arguments(parser, args)
        prefer_command_line(self.config.model.lr_schedule, args)
        check_early(self.config)
        if print_flags is not None:  # --print_config: what the run would check, then the config
            check_trainer(self.config.trainer)
            check_seq_len(self.config)
            check_run(self.config, printing=True)
            sys.stdout.write(parser.dump(self.config, **print_flags))
            raise SystemExit(0)
        if rank_zero_only.rank == 0:
            remove_at_exit_if_unused(self.config.trainer.default_root_dir or ".", checkpoint_dir(self.config))

    # model.init_from, opened once by start_from and handed to the LightningModule built from it
    initial_checkpoint: Any = None

    def before_instantiate_classes(self) -> None:
        config = self.config
        if config.model.init_from is not None:
            self.initial_checkpoint = start_from(config)
        check_trainer(config.trainer)
        check_seq_len(config)
        check_run(config)
        folder = checkpoint_dir(config)
        if rank_zero_only.rank == 0:
            hold_run_folders(config, folder)  # before anything in them is read, cleaned or written
        choice = choose_checkpoint(config.resume, folder, clean=rank_zero_only.rank == 0)
        self.ckpt_path = choice.path if choice is not None else None
        self.resumed_step = choice.step if choice is not None and choice.step is not None else 0
        if self.ckpt_path is None:
            refuse_earlier_checkpoints(folder, choice.skipped if choice is not None else None)
            refuse_earlier_run(config.trainer.default_root_dir or ".")
        else:
            check_resume_shape(choice.checkpoint or self.ckpt_path, config)
            check_form_fits(choice.checkpoint, config.trainer.strategy)  # a DCP folder under single: one line
            summary = finished_summary(config, self.resumed_step)
            if summary is not None:
                raise RunFinished(config, self.resumed_step, summary)
        if choice is not None and rank_zero_only.rank == 0:
            print(choice.message(folder), flush=True)

    def instantiate_classes(self) -> None:
        from framework.training.init_from import handed_over

        with handed_over(self.initial_checkpoint):
            super().instantiate_classes()

    def _instantiate_trainer(self, config: dict[str, Any], callbacks: list[Any]) -> Trainer:
        config = dict(config)
        config["strategy"] = named_strategy(config)
        config["precision"] = default_precision(config)
        given = list(config.get("callbacks") or []) + list(callbacks)
        if config.get("enable_progress_bar") is None and not sys.stdout.isatty():
            config["enable_progress_bar"] = False  # in a log its last frame lands after the summary; lines say it
        if config.get("enable_progress_bar") is not False and not any(isinstance(cb, ProgressBar) for cb in given):
            callbacks = [*callbacks, StepProgressBar()]  # steps out of max_steps, not "Epoch 0/-2"
        every = self.config.get("progress_every")
        if every is not None and not sys.stdout.isatty():
            callbacks = [*callbacks, StepProgressLines(every)]  # a bar draws nothing into a log file
        if config.get("enable_model_summary") is not False and not any(isinstance(cb, ModelSummary) for cb in given):
            callbacks = [*callbacks, FlopCountedSummary()]  # Lightning's table said 'Total FLOPs: 0'
        if config.get("logger") is not False and not any(isinstance(cb, LearningRateMonitor) for cb in given):
            callbacks = [*callbacks, LearningRateMonitor(logging_interval="step")]
        # The tokenizer beside the checkpoints; the export at the end, ahead of RunSummary:
        # a resumed run whose export was killed makes it before the summary says "done".
        callbacks = [*export_callbacks(), *callbacks]
        if config.get("logger") in (None, True):
            config["logger"] = run_logger(config.get("default_root_dir"), resumed=self.ckpt_path is not None)
        trainer = super()._instantiate_trainer(config, callbacks)
        use_atomic_checkpoint_io(trainer)
        return trainer


def build_cli(argv: list[str], cli_class: type[PretrainCLI] | None = None) -> PretrainCLI:
    """The CLI of ``argv`` (``cli_class``: a PretrainCLI subclass to build instead)."""
    from framework.training.data import TokenDataModule

    bound_recipe_yaml()
    with warnings.catch_warnings():
        # `layerdrop pretrain` passes its own argv on purpose (sys.argv holds "pretrain" too);
        # Lightning warns about that on every run.
        warnings.filterwarnings("ignore", message="LightningCLI's args parameter is intended")
        return (cli_class or PretrainCLI)(
            LayerDropModule, TokenDataModule, args=argv, run=False,
            seed_everything_default=1234,
            trainer_defaults={"log_every_n_steps": 10, "num_sanity_val_steps": 0},
            save_config_kwargs={"overwrite": True},  # a resumed run logs into a new version folder
            # exit_on_error=False: a bad flag or recipe key raises, and main() says so in one
            # line instead of the ~100 lines of usage jsonargparse prints first.
            parser_kwargs={"prog": PROG, "description": "Pretrain a decoder with layer dropout (LightningCLI fit).",
                           "exit_on_error": False},
            auto_configure_optimizers=False,
        )


def bound_recipe_yaml() -> None:
    """jsonargparse's YAML loader (every recipe file, value, and file a value names) behind the
    nesting bounds of framework/files/nesting.py: a "billion laughs" is refused, not expanded."""
    import yaml
    from jsonargparse import get_loader, set_loader

    load = get_loader("yaml")
    if not hasattr(load, "bounds"):
        set_loader("yaml", bounded_yaml_loader(load, "a YAML document the recipe parser read"), (yaml.YAMLError,))


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        cli = build_cli(argv)
        fit(cli)
    except SIGTERMException:
        print("error: stopped by SIGTERM; the last periodic checkpoint is intact: continue with --resume auto",
              file=sys.stderr)
        return 128 + signal.SIGTERM
    except RunFinished as finished:  # --resume auto on a finished run: nothing to do, nothing touched
        if rank_zero_only.rank == 0:
            print(finished, flush=True)
        return 0
    except SystemExit as exit_:  # --help, --print_config
        return exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 2)
    except ArgumentError as err:  # a bad flag, recipe key or value
        print(f"error: {' '.join(str(err).split())}; see {PROG} --help", file=sys.stderr)
        return 2
    except DiskFull as err:  # which file, bytes needed and free, the checkpoint to resume from
        if rank_zero_only.rank == 0:  # every rank raises the same error (saving.py agrees them): one line
            print(f"error: {err}", file=sys.stderr)
        return 1
    except NonFiniteLossError as err:
        if rank_zero_only.rank == 0:
            print(f"error: {err}", file=sys.stderr)
        return 1
    except WorldSizeError as err:  # raised alike on every rank: one line for the job
        if rank_zero_only.rank == 0:
            print(f"error: {str(err).strip().splitlines()[0]}", file=sys.stderr)
        return 2
    except (ValueError, CheckpointError, FileNotFoundError, MisconfigurationException, RunFolderInUse) as err:
        print(f"error: {str(err).strip().splitlines()[0]}", file=sys.stderr)
        return 2
    finally:
        release_run_folders()
    return 0


# The run-folder locks this process holds while `main` runs (released when it returns).
HELD_LOCKS: list[RunLock] = []


def release_run_folders() -> None:
    """Release the run-folder locks this process holds: ``main`` does at its end, and so must
    a caller of ``build_cli`` that inspects the run without fitting it (a test, a script),
    or the folder stays in use while the process lives."""
    while HELD_LOCKS:
        HELD_LOCKS.pop().release()


def hold_run_folders(config: Any, checkpoints: Path) -> None:
    """Lock the run folder, and a checkpoint folder outside it, for the whole run
    (framework/files/run_lock.py): a second run there is refused in one line."""
    root = Path(config.trainer.default_root_dir or ".")
    folders = [root] if Path(os.path.realpath(checkpoints)).is_relative_to(os.path.realpath(root)) \
        else [root, checkpoints]
    for folder in folders:
        if is_url(folder):
            continue
        lock = RunLock(folder, "pretrain")
        note = lock.acquire()
        HELD_LOCKS.append(lock)
        if note:
            print(f"note: {note}", file=sys.stderr, flush=True)


def fit(cli: PretrainCLI) -> None:
    """``trainer.fit``; a run that fails before its first step leaves no log folder behind
    (a version_N holding only the config would pass for a run)."""
    trainer = cli.trainer
    log_dir = Path(trainer.log_dir) if trainer.loggers and trainer.is_global_zero and trainer.log_dir else None
    fresh = log_dir is not None and not log_dir.exists()
    parent_fresh = log_dir is not None and not log_dir.parent.exists()
    try:
        trainer.fit(cli.model, datamodule=cli.datamodule, ckpt_path=cli.ckpt_path)
    except BaseException as error:
        if fresh and trainer.global_step <= cli.resumed_step:
            shutil.rmtree(log_dir, ignore_errors=True)
            if parent_fresh and log_dir.parent.is_dir() and not any(log_dir.parent.iterdir()):
                log_dir.parent.rmdir()
        if isinstance(error, SystemExit) and trainer.interrupted:  # Ctrl-C: Lightning shut down, exits 1
            print(f"error: stopped by Ctrl-C at step {trainer.global_step}; the checkpoints are intact: continue "
                  f"with {resume_command()}", file=sys.stderr, flush=True)
            raise SystemExit(128 + signal.SIGINT) from None
        raise


def resume_command() -> str:
    """This command line with ``--resume auto``, as a user would type it again."""
    argv = sys.argv[1:] if sys.argv[1:2] == ["pretrain"] else ["pretrain", *sys.argv[1:]]
    if not any(arg == "--resume" or arg.startswith("--resume=") for arg in argv):
        argv = [*argv, "--resume", "auto"]
    return shlex.join(["layerdrop", *argv])


def run_logger(root: str | None, *, resumed: bool) -> Any:
    """Lightning's default TensorBoard logger, less its placeholder ``hp_metric = -1``; a
    resumed run logs into the version it continues (the newest), so its curves go on in
    one run instead of starting a version_N+1 at step N."""
    from lightning.pytorch.loggers import TensorBoardLogger

    logs = Path(root or ".") / "lightning_logs"
    versions = [int(p.name.split("_")[1]) for p in logs.glob("version_*") if p.name.split("_")[1].isdigit()]
    return TensorBoardLogger(save_dir=root or ".", version=max(versions) if resumed and versions else None,
                             default_hp_metric=False)


# ------------------------------------------------------------------ before the run


class RunFinished(Exception):
    """A resumed run that has nothing left to do; ``str()`` is its line and its summary."""

    def __init__(self, config: Any, step: int, summary: dict[str, Any]) -> None:
        root = config.trainer.default_root_dir or "."
        line = (f"resume: {root} finished at step {step} (trainer.max_steps {config.trainer.max_steps}): nothing to "
                "train; its files are left as they were (to train on, raise --trainer.max_steps)")
        super().__init__(line + "\n" + format_summary(summary, read_twin(config.summary.compare_to)))


def finished_summary(config: Any, step: int) -> dict[str, Any] | None:
    """The summary.json of the run in trainer.default_root_dir when resuming it from step
    ``step`` leaves nothing to do: no step to train (``step`` >= max_steps), and the
    export and the summary both of that step. Going on would only rewrite the summary
    (Lightning keeps no metric in a checkpoint) and log into the run again, so the run
    is left as it is; ``make demo`` shows a finished run's summary the same way.
    None otherwise (a run killed while exporting or before its summary is finished by
    the fit: framework/training/checkpointing/final_export.py)."""
    root = Path(config.trainer.default_root_dir or ".")
    if is_url(root) or not 0 < config.trainer.max_steps <= step or exported_step(root / EXPORT_FOLDER) != step:
        return None
    try:
        summary = json.loads((root / SUMMARY_FILE).read_text())
    except (OSError, ValueError):
        return None
    return summary if isinstance(summary, dict) and summary.get("steps") == step else None


def checkpoint_dir(config: Any) -> Path:
    """Where PeriodicCheckpoint writes: its ``dirpath`` or <default_root_dir>/checkpoints."""
    dirpath = config.checkpoint.dirpath
    if dirpath:
        return Path(dirpath)
    return Path(config.trainer.default_root_dir or ".") / "checkpoints"


def start_from(config: Any) -> Any:
    """``model.init_from``: the decoder section becomes the checkpoint's model, its own
    parametrization base (framework/training/init_from.py); said in one line. Returns the
    checkpoint, opened."""
    from framework.checkpoint import Checkpoint
    from framework.config import ModelConfig, ParametrizationConfig
    from framework.training.init_from import initial_config, own_base

    path = config.model.init_from
    ckpt = Checkpoint.open(path)
    decoder = initial_config(ckpt, _as_dict(config.model.decoder))
    pcfg = own_base(ParametrizationConfig(**_as_dict(config.model.parametrization)), ModelConfig(**decoder))
    for key, value in decoder.items():
        setattr(config.model.decoder, key, value)
    config.model.parametrization.d_base, config.model.parametrization.n_layers_base = pcfg.d_base, pcfg.n_layers_base
    config.data.model_vocab_size = decoder["vocab_size"]
    if rank_zero_only.rank == 0:
        print(f"model.init_from={path}: a {decoder['family']} decoder (d = {decoder['d_model']}, L = "
              f"{decoder['n_layers']}, vocabulary {decoder['vocab_size']}), its own parametrization base "
              "(m_d = m_L = 1)", flush=True)
    return ckpt


def check_trainer(trainer: Any) -> None:
    """The Trainer settings Lightning would reject with a traceback, or not at all
    (accumulate_grad_batches=0 divides by zero at the first step)."""
    max_steps = trainer.max_steps
    if isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1:
        raise ValueError(f"trainer.max_steps={max_steps!r} is invalid: pretraining needs the run length (the LR "
                         "decay, the weight-decay timescale and the layer-dropout schedule depend on it); "
                         "set a positive --trainer.max_steps")
    for key in ("accumulate_grad_batches", "num_nodes"):
        check(f"trainer.{key}", getattr(trainer, key, 1), PositiveInt)
    devices = trainer.devices
    count = int(devices) if isinstance(devices, int) or (isinstance(devices, str) and devices.lstrip("-").isdigit()) \
        else None
    if isinstance(devices, bool) or (count is not None and count < 1 and count != -1) or \
            (isinstance(devices, (list, tuple)) and not devices):
        raise ValueError(f"trainer.devices={devices if count is None else count!r} is invalid: a positive number of "
                         "devices, -1 (all of them), a list of device indices or 'auto'")


def check_early(config: Any) -> None:
    """What can be refused right after parsing, before Lightning seeds (and says so): a
    refused value is then the run's one line."""
    every = config.progress_every
    if every is not None and not every >= 0:
        raise ValueError(f"progress_every={every!r} is invalid: must be a number of seconds >= 0, or null for "
                         "no progress lines")
    from framework.config import ParametrizationConfig

    ParametrizationConfig(**_as_dict(config.model.parametrization))  # lr, eps: bounded (AdamW runs in float32)


def check_seq_len(config: Any) -> None:
    seq_len = getattr(config.data, "seq_len", None)
    max_len = config.model.decoder.max_seq_len
    if seq_len is not None and seq_len > max_len:
        raise ValueError(f"data.seq_len={seq_len} is invalid: it exceeds model.decoder.max_seq_len={max_len}")


def check_resume_shape(ckpt: Any, config: Any) -> None:
    """Compare the checkpoint's model (a path or an opened Checkpoint) with the
    configured one before anything is built (only the small config entry is read)."""
    saved = read_metadata(ckpt).get(CKPT_KEY, {}).get("model_config")
    if not isinstance(saved, dict):
        raise CheckpointError(f"checkpoint {str(getattr(ckpt, 'path', ckpt))!r} was not written by layerdrop pretrain "
                              f"(no {CKPT_KEY!r} entry)")
    from framework.config import ModelConfig, ParametrizationConfig

    decoder = ModelConfig(**_as_dict(config.model.decoder))
    pcfg = ParametrizationConfig(**_as_dict(config.model.parametrization))
    check_same_model(saved, with_parametrization(decoder, pcfg).to_dict())


def default_precision(config: dict[str, Any]) -> Any:
    """The recipe's precision, or when it sets none: bf16-mixed on GPUs, 32-true on CPUs."""
    precision, accelerator = config.get("precision"), config.get("accelerator", "auto")
    from framework.strategies import ACCELERATORS, precision_for

    if precision is not None or not isinstance(accelerator, str) or accelerator not in ACCELERATORS:
        return precision
    return precision_for(accelerator)


def named_strategy(config: dict[str, Any]) -> Any:
    """Recipe strategy names (framework.strategies.STRATEGIES) become strategy objects;
    anything else goes to Lightning as given."""
    from framework.strategies import STRATEGIES, build_strategy

    name = config.get("strategy", "auto")
    if not isinstance(name, str) or name not in STRATEGIES:
        return name
    return build_strategy(name, accelerator=str(config.get("accelerator", "auto")),
                          devices=config.get("devices", "auto"), num_nodes=config.get("num_nodes", 1))


def _as_dict(section: Any) -> dict[str, Any]:
    if hasattr(section, "as_dict"):
        return section.as_dict()
    return dict(vars(section)) if not isinstance(section, dict) else dict(section)


if __name__ == "__main__":
    sys.exit(main())

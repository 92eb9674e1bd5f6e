"""`layerdrop pretrain`: LightningCLI ``fit`` of ``LayerDropModule`` on prepared tokens.

    layerdrop pretrain --config recipes/tiny.yaml [--model.layer_dropout.p_max 0.2 ...]
    layerdrop pretrain --config recipes/tiny.yaml --print_config     # the resolved config
    layerdrop pretrain --config recipes/tiny.yaml --resume auto      # continue a run

Sections of a recipe: ``trainer`` (Lightning's Trainer), ``model`` (LayerDropModule:
decoder, layer_dropout, parametrization, lr_schedule), ``data`` (TokenDataModule),
``checkpoint`` (PeriodicCheckpoint), ``throughput`` (Throughput: peak FLOPs for MFU),
``summary`` (RunSummary) and ``resume``. A run lives in ``trainer.default_root_dir``:

    <root>/checkpoints/step-XXXXXXXX.ckpt, last.ckpt
    <root>/lightning_logs/version_N/      TensorBoard events + config.yaml (resolved config)
    <root>/summary.json                   what the run did (also printed at the end)

Everything that can be checked before the first step is checked first, with a one-line
error: the resume target, the checkpoint's model shape against the config, the data's
vocabulary against the model (the DataModule's setup), a non-constant dropout schedule
or LR decay without ``max_steps``.
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import LearningRateMonitor, ProgressBar, RichProgressBar
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.utilities.exceptions import SIGTERMException

from framework.callbacks import RunSummary, Throughput
from framework.checkpointing import PeriodicCheckpoint, refuse_earlier_checkpoints, use_atomic_checkpoint_io
from framework.checkpoint import CKPT_KEY, CheckpointError
from framework.export import export_callbacks
from framework.module import LayerDropModule, check_same_model, with_parametrization
from framework.nonfinite import NonFiniteLossError

PROG = "layerdrop pretrain"


class PretrainCLI(LightningCLI):
    """LightningCLI without subcommands (always ``fit``), plus ``--resume`` and the
    run's callbacks as their own config sections."""

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.add_argument("--resume", type=str | None, default=None,
                            help="'auto': continue from <checkpoint dir>/last.ckpt when it exists "
                                 "(else start fresh); or the path of a .ckpt to continue from")
        # The DataModule checks the prepared vocabulary against the embedding at setup.
        parser.link_arguments("model.decoder.vocab_size", "data.model_vocab_size")
        parser.add_lightning_class_args(PeriodicCheckpoint, "checkpoint")
        parser.add_lightning_class_args(Throughput, "throughput")
        parser.add_lightning_class_args(RunSummary, "summary")

    def before_instantiate_classes(self) -> None:
        config = self.config
        self.ckpt_path = resolve_resume(config.resume, checkpoint_dir(config))
        check_seq_len(config)
        if self.ckpt_path is None:
            refuse_earlier_checkpoints(checkpoint_dir(config))
        else:
            check_resume_shape(self.ckpt_path, config)

    def _instantiate_trainer(self, config: dict[str, Any], callbacks: list[Any]) -> Trainer:
        config = dict(config)
        config["strategy"] = named_strategy(config)
        config["precision"] = default_precision(config)
        given = list(config.get("callbacks") or []) + list(callbacks)
        if config.get("enable_progress_bar") is not False and not any(isinstance(cb, ProgressBar) for cb in given):
            callbacks = [*callbacks, RichProgressBar()]
        if config.get("logger") is not False and not any(isinstance(cb, LearningRateMonitor) for cb in given):
            callbacks = [*callbacks, LearningRateMonitor(logging_interval="step")]
        callbacks = [*callbacks, *export_callbacks()]  # tokenizer beside the checkpoints; export at the end
        trainer = super()._instantiate_trainer(config, callbacks)
        use_atomic_checkpoint_io(trainer)
        return trainer


def build_cli(argv: list[str]) -> PretrainCLI:
    from framework.data import TokenDataModule

    return PretrainCLI(
        LayerDropModule, TokenDataModule, args=argv, run=False,
        seed_everything_default=1234,
        trainer_defaults={"log_every_n_steps": 10, "num_sanity_val_steps": 0},
        save_config_kwargs={"overwrite": True},  # a resumed run logs into a new version folder
        parser_kwargs={"prog": PROG, "description": "Pretrain a decoder with layer dropout (LightningCLI fit)."},
        auto_configure_optimizers=False,
    )


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        cli = build_cli(argv)
        cli.trainer.fit(cli.model, datamodule=cli.datamodule, ckpt_path=cli.ckpt_path)
    except SIGTERMException:
        print("error: stopped by SIGTERM; the last periodic checkpoint is intact: continue with --resume auto",
              file=sys.stderr)
        return 128 + signal.SIGTERM
    except SystemExit as exit_:  # argparse errors, --help, --print_config
        return exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 2)
    except NonFiniteLossError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    except (ValueError, CheckpointError, FileNotFoundError) as err:
        print(f"error: {str(err).strip().splitlines()[0]}", file=sys.stderr)
        return 2
    return 0


# ------------------------------------------------------------------ before the run


def checkpoint_dir(config: Any) -> Path:
    """Where PeriodicCheckpoint writes: its ``dirpath`` or <default_root_dir>/checkpoints."""
    dirpath = config.checkpoint.dirpath
    if dirpath:
        return Path(dirpath)
    return Path(config.trainer.default_root_dir or ".") / "checkpoints"


def resolve_resume(resume: str | None, ckpt_dir: Path) -> str | None:
    """The checkpoint to continue from: None (fresh run), last.ckpt for 'auto', or a path."""
    if resume is None or resume == "":
        return None
    if resume == "auto":
        last = ckpt_dir / "last.ckpt"
        return str(last) if last.exists() else None
    if not Path(resume).exists():
        raise ValueError(f"--resume {resume!r} is invalid: no such checkpoint (use 'auto' or an existing .ckpt)")
    return resume


def check_seq_len(config: Any) -> None:
    seq_len = getattr(config.data, "seq_len", None)
    max_len = config.model.decoder.max_seq_len
    if seq_len is not None and seq_len > max_len:
        raise ValueError(f"data.seq_len={seq_len} is invalid: it exceeds model.decoder.max_seq_len={max_len}")


def check_resume_shape(ckpt_path: str, config: Any) -> None:
    """Compare the checkpoint's model with the configured one before anything is built
    (memory-mapped: only the small config entry is read)."""
    try:
        ckpt = torch.load(checkpoint_metadata_file(ckpt_path), map_location="cpu", weights_only=True, mmap=True)
    except Exception as err:
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise CheckpointError(f"checkpoint {ckpt_path!r} cannot be loaded safely: {reason}") from None
    saved = ckpt.get(CKPT_KEY, {}).get("model_config") if isinstance(ckpt, dict) else None
    if not isinstance(saved, dict):
        raise CheckpointError(f"checkpoint {ckpt_path!r} was not written by layerdrop pretrain "
                              f"(no {CKPT_KEY!r} entry)")
    from framework.config import ModelConfig, ParametrizationConfig

    decoder = ModelConfig(**_as_dict(config.model.decoder))
    pcfg = ParametrizationConfig(**_as_dict(config.model.parametrization))
    check_same_model(saved, with_parametrization(decoder, pcfg).to_dict())


def checkpoint_metadata_file(ckpt_path: str) -> Path:
    """The file holding a checkpoint's non-tensor entries. Sharded strategies save folders:
    FSDP2 (ModelParallelStrategy) keeps them in ``meta.pt``, DeepSpeed in its rank-0
    model-states file."""
    path = Path(ckpt_path)
    if path.is_dir():
        for candidate in (path / "meta.pt", path / "checkpoint" / "mp_rank_00_model_states.pt",
                          path / "checkpoint" / "zero_pp_rank_0_mp_rank_00_model_states.pt"):
            if candidate.is_file():
                return candidate
    return path


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

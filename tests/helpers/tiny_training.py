"""Shared pieces of the training-loop tests: a tiny module, in-memory token batches, a
logger that keeps what it is given, a quiet CPU Trainer, and the FLOPs a run's masks plan."""

from __future__ import annotations

import shutil
import sysconfig
from pathlib import Path
from typing import Any, Callable

import lightning.pytorch as pl
import torch
from lightning.pytorch.loggers import Logger
from torch.utils.data import DataLoader, TensorDataset

from framework.config import LayerDropoutConfig, ModelConfig, ParametrizationConfig
from framework.flops import Flops, dense_step_flops, executed_step_flops
from framework.layer_dropout import StepKey, plan
from framework.schedules import dropout_rates
from framework.training.lr_schedule import LRScheduleConfig
from framework.training.module import LayerDropModule

VOCAB = 64
SEQ = 16


def tiny_module(p_max: float = 0.4, schedule: str = "decreasing", layers: int = 4, **kwargs: Any) -> LayerDropModule:
    kwargs.setdefault("parametrization", ParametrizationConfig(d_base=16, n_layers_base=2, lr=1e-2))
    kwargs.setdefault("lr_schedule", LRScheduleConfig(warmup_steps=1))
    kwargs.setdefault("layer_dropout", LayerDropoutConfig(p_max=p_max, schedule=schedule, seed=7))
    return LayerDropModule(
        decoder=ModelConfig(vocab_size=VOCAB, d_model=32, n_layers=layers, n_heads=2, max_seq_len=SEQ), **kwargs)


class RandomTokens(pl.LightningDataModule):
    """Fixed random sequences (a repeating pattern, so the loss can fall)."""

    def __init__(self, batch_size: int = 8, batches: int = 64, val_batches: int = 2) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(0)
        pattern = torch.randint(0, VOCAB, (SEQ + 1,), generator=gen)
        rows = torch.stack([torch.roll(pattern, int(s)) for s in torch.randint(0, SEQ, (batch_size * batches,),
                                                                                generator=gen)])
        self.train = TensorDataset(rows[:, :-1], rows[:, 1:])
        val = torch.randint(0, VOCAB, (batch_size * val_batches, SEQ + 1), generator=gen)
        self.val = TensorDataset(val[:, :-1], val[:, 1:])
        self.batch_size = batch_size

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train, batch_size=self.batch_size)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val, batch_size=self.batch_size)


class KeepingLogger(Logger):
    """Keeps every logged metric as {name: [(step, value), ...]}."""

    def __init__(self) -> None:
        super().__init__()
        self.metrics: dict[str, list[tuple[int, float]]] = {}

    @property
    def name(self) -> str:
        return "keeping"

    @property
    def version(self) -> int:
        return 0

    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        pass

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        for key, value in metrics.items():
            self.metrics.setdefault(key, []).append((step, float(value)))

    def values(self, key: str) -> list[float]:
        return [v for _, v in self.metrics.get(key, [])]


def quiet_trainer(**kwargs: Any) -> pl.Trainer:
    defaults = dict(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                    enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                    limit_val_batches=0, log_every_n_steps=1)
    return pl.Trainer(**{**defaults, **kwargs})


def prepare_tiny_data(out: str | Path) -> str:
    """~200k tokens of real Python (the standard library's json and email packages)
    through `layerdrop prepare`: a trained byte-level BPE of 300 entries (EOS id 0), 10%
    validation, chunks of 8192 tokens. Tests read the session's copy
    (``prepared_tokens`` in tests/conftest.py) rather than making their own."""
    from data_prep.prepare import main as prepare

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    assert prepare(["--files", str(stdlib / "json" / "*.py"), "--files", str(stdlib / "email" / "*.py"),
                    "--tokenizer", "train", "--vocab-size", "300", "--max-tokens", "200k", "--val-fraction", "0.1",
                    "--chunk-tokens", "8192", "--workers", "1", "--no-progress", "--out", str(out)]) == 0
    return str(out)


def prepare_second_source(tokens: str | Path, out: str | Path) -> str:
    """A second source for data mixtures: the standard library's http package (~54k train
    tokens, 20% val) through `layerdrop prepare` with the tokenizer.json of ``tokens``."""
    from data_prep.prepare import main as prepare

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    assert prepare(["--files", str(stdlib / "http" / "*.py"), "--tokenizer", str(Path(tokens) / "tokenizer.json"),
                    "--max-tokens", "60k", "--val-fraction", "0.2", "--chunk-tokens", "8192", "--workers", "1",
                    "--no-progress", "--out", str(out)]) == 0
    return str(out)


def shared_once(base: Path, name: str, make: Callable[[Path], None]) -> Path:
    """``base/name``, made once by whichever pytest-xdist worker gets there first (the
    others wait on a file lock and reuse it)."""
    from filelock import FileLock

    target = base / name
    with FileLock(str(base / f"{name}.lock")):
        if not (target / ".done").exists():
            if target.exists():
                shutil.rmtree(target)  # a half-made attempt that failed
            target.mkdir(parents=True)
            make(target)
            (target / ".done").touch()
    return target


def tiny_cli_args(data_dir, root, *, steps: int = 6, p_max: float = 0.4) -> list[str]:
    """`layerdrop pretrain` arguments: recipes/tiny.yaml shrunk to seconds on a CPU."""
    recipe = Path(__file__).resolve().parents[2] / "recipes" / "tiny.yaml"
    return ["--config", str(recipe), "--data.data_dir", str(data_dir), "--trainer.default_root_dir", str(root),
            "--model.decoder.vocab_size", "300", "--model.decoder.d_model", "32", "--model.decoder.n_layers", "3",
            "--model.decoder.n_heads", "2", "--model.decoder.max_seq_len", "32",
            "--model.parametrization.d_base", "32", "--model.parametrization.n_layers_base", "3",
            "--model.layer_dropout.p_max", str(p_max), "--model.lr_schedule.warmup_steps", "1",
            "--data.seq_len", "32", "--data.batch_size", "4", "--data.val_batches", "2",
            "--trainer.max_steps", str(steps), "--trainer.val_check_interval", "3",
            "--trainer.limit_val_batches", "2", "--trainer.log_every_n_steps", "1",
            "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false",
            "--checkpoint.every_n_steps", "3", "--checkpoint.keep_last", "2"]


class RecordLosses(pl.Callback):
    """Appends (step, micro-batch, loss, batch checksum) of every training micro-batch
    to a JSON-lines file, exactly (repr of the float)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        import json

        stats = outputs["stats"]
        record = {"step": stats.step, "micro": stats.micro_batch,
                  "loss": float(outputs["loss"]), "batch": int(batch[0].sum())}
        with open(self.path, "a") as handle:
            handle.write(json.dumps(record) + "\n")


class SimulatedCrash(RuntimeError):
    pass


class CrashAtStep(pl.Callback):
    """Dies after optimizer step ``step`` as a killed job would: no checkpoint, no cleanup."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step >= self.step:
            raise SimulatedCrash(f"simulated crash after step {trainer.global_step}")


def planned_flops(module, steps, *, accumulate=1, batch=8, rank=0):
    """Executed and dense FLOPs of every optimizer step, recomputed from the masks the
    step keys draw (not from anything the run reports)."""
    cfg, n = module.model_cfg, module.model_cfg.n_layers
    executed, dense = [], []
    for step in range(steps):
        rates = dropout_rates(module.dropout_cfg, n, step, steps)
        step_executed = step_dense = None
        for micro in range(accumulate):
            key = StepKey(module.dropout_cfg.seed, rank, step, micro)
            kept = [(batch, batch)] * n if not any(rates) else plan(module.dropout_cfg, rates, batch, key).kept_counts()
            e, d = executed_step_flops(cfg, kept, SEQ, batch_size=batch), dense_step_flops(cfg, batch, SEQ)
            step_executed = e if step_executed is None else _added(step_executed, e)
            step_dense = d if step_dense is None else _added(step_dense, d)
        executed.append(step_executed)
        dense.append(step_dense)
    return executed, dense


def _added(a: Flops, b: Flops) -> Flops:
    return Flops(a.attention + b.attention, a.ffn + b.ffn, a.head + b.head)

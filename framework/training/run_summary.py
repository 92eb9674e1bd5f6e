"""The end of a pretraining run: ``RunSummary`` prints and writes
``<default_root_dir>/summary.json`` (steps, tokens, the last validation loss against ln(V),
the FLOPs layer dropout saved, throughput, the data it read, where the logs and the checkpoint are), and
``format_summary`` is the block a person reads (``make demo`` shows a finished run's with it).

The last validation's results travel in the checkpoints (RunSummary's state): a run
resumed only to finish its export validates nothing, and Lightning keeps no metric in a
checkpoint, so its summary would otherwise lose them.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import lightning.pytorch as pl

from framework.early_exit_loss import mean_exit_heads
from framework.files.atomic_write import write_json
from framework.files.manifest import data_identity
from framework.flops import head_flops_per_token
from framework.training.callbacks import EarlyExitLosses, LayerDropoutSchedule, Throughput


SUMMARY_FILE = "summary.json"


class RunSummary(pl.Callback):
    """At the end of fit, prints and writes (``<default_root_dir>/summary.json``) what
    the run did: steps, tokens, validation loss against ln(V) (a uniform guess), the
    training FLOPs layer dropout saved, and where the logs and checkpoint are.

    Args:
        compare_to: the ``summary.json`` of another run (e.g. the dense twin) to set
            this run's validation loss and FLOPs against.
    """

    def __init__(self, compare_to: str | None = None) -> None:
        self.compare_to = compare_to
        self.summary: dict[str, Any] | None = None
        self.validation: dict[str, float] = {}  # the last validation's results, as the checkpoint holds them

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._trainer = trainer  # state_dict reads the last validation's results

    def last_validation(self, trainer: pl.Trainer) -> dict[str, float]:
        """``val/*`` of the last validation: this fit's, else the one the checkpoint it
        resumed from recorded. A run resumed only to finish its export validates nothing,
        and Lightning keeps no metric in a checkpoint."""
        ran = {key: float(value) for key, value in trainer.callback_metrics.items() if key.startswith("val/")}
        return ran or dict(self.validation)

    def state_dict(self) -> dict[str, Any]:
        trainer = getattr(self, "_trainer", None)
        return {"validation": self.last_validation(trainer) if trainer is not None else dict(self.validation)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.validation = {str(key): float(value) for key, value in (state_dict.get("validation") or {}).items()}

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        schedule = next(cb for cb in trainer.callbacks if isinstance(cb, LayerDropoutSchedule))
        report = schedule.report(trainer, pl_module)  # collective: every rank calls it
        rates = next((cb for cb in trainer.callbacks if isinstance(cb, Throughput)), None)
        throughput = rates.run_figures(trainer) if rates is not None else None  # collective too
        if not trainer.is_global_zero:
            return
        metrics = self.last_validation(trainer)
        val = metrics.get("val/loss")
        vocab = pl_module.model_cfg.vocab_size
        self.summary = {
            "steps": trainer.global_step,
            "tokens": int(report["tokens"]),
            "val_loss": val,
            "ln_vocab": math.log(vocab),
            # the blocks only, as before the two conventions were named (readers of older summaries)
            "training_flops": report["executed_flops"],
            "dense_training_flops": report["dense_flops"],
            "flops_saved_pct": 100.0 * report["saved_fraction"],
            **flop_counts(report, pl_module, trainer.max_steps),
            "mean_dropout_predicted": report["mean_dropout_predicted"],
            **early_exit_summary(trainer, metrics),
            **mixture_summary(trainer, metrics),
            **in_loop_evaluation_summary(trainer),
            **({"throughput": throughput} if throughput is not None else {}),
            "tensorboard": trainer.logger.log_dir if trainer.logger is not None else None,
            "checkpoint": trainer.checkpoint_callback.last_model_path if trainer.checkpoint_callback else None,
        }
        identity = data_identities(trainer)
        if identity:
            self.summary.setdefault("data", {})["identity"] = identity
        write_json(Path(trainer.default_root_dir) / SUMMARY_FILE, self.summary)  # whole or not at all
        print(format_summary(self.summary, self._twin()), flush=True)

    def _twin(self) -> dict[str, Any] | None:
        return read_twin(self.compare_to)


def read_twin(compare_to: str | None) -> dict[str, Any] | None:
    """The summary.json of the run to compare with (``summary.compare_to``), when there is one."""
    if not compare_to:
        return None
    path = Path(compare_to)
    return json.loads(path.read_text()) if path.is_file() else None


def flop_counts(report: dict[str, float], pl_module: pl.LightningModule, total_steps: int) -> dict[str, float]:
    """The run's training FLOPs in both conventions, each executed and dense, named so:
    non-embedding (the blocks only: the paper's "FLOPs", the share P̄ saves) and total (the blocks,
    the unembedding and every early-exit head: what the run costs). Dense: the same tokens through
    a plain dense model, every block on every row and one head. The heads' FLOPs are the tokens'
    unembedding times (1 + the early-exit heads the loss's curriculum runs a step, mean_exit_heads)."""
    model_cfg = pl_module.model_cfg
    exits = getattr(pl_module, "exit_cfg", None)
    heads = mean_exit_heads(exits, model_cfg.n_layers, total_steps) if exits is not None and exits.scale else 0.0
    head = report["tokens"] * head_flops_per_token(model_cfg)
    total, dense_total = report["executed_flops"] + head * (1.0 + heads), report["dense_flops"] + head
    return {"non_embedding_training_flops": report["executed_flops"],
            "dense_non_embedding_training_flops": report["dense_flops"],
            "total_training_flops": total, "dense_total_training_flops": dense_total,
            "total_flops_saved_pct": 100.0 * (1.0 - total / dense_total) if dense_total > 0 else 0.0,
            "early_exit_heads_per_step": heads}


def early_exit_summary(trainer: pl.Trainer, metrics: dict[str, float]) -> dict[str, Any]:
    """The early-exit loss's part of the summary: the last validation loss at every
    configured exit (from ``metrics``, the last validation's) and the last logged
    training loss at each exit (empty when off)."""
    losses = next((cb for cb in trainer.callbacks if isinstance(cb, EarlyExitLosses)), None)
    if losses is None:
        return {}
    prefix = "val/early_exit/loss_"
    val = {key.removeprefix(prefix): float(value) for key, value in metrics.items() if key.startswith(prefix)}
    return {"early_exit_loss": {
        "scale": trainer.lightning_module.exit_cfg.scale,
        "val_loss": dict(sorted(val.items(), key=lambda item: int(item[0]))),
        "train_loss": {str(k): v for k, v in sorted(losses.last.items())},
    }}


def mixture_summary(trainer: pl.Trainer, metrics: dict[str, float]) -> dict[str, Any]:
    """A data mixture's part of the summary: tokens and last validation loss per source (from
    ``metrics``), the phases of weights (framework/training/data/source_tokens.py; empty for
    one folder)."""
    from framework.training.data.source_tokens import SourceTokens

    counter = next((cb for cb in trainer.callbacks if isinstance(cb, SourceTokens)), None)
    return counter.summary(trainer, metrics) if counter is not None else {}


def data_identities(trainer: pl.Trainer) -> dict[str, dict]:
    """Which data the run trained on (``summary["data"]["identity"]``): framework/files/manifest.py's
    ``data_identity`` of each folder, under ``"data"`` for one folder and under each source's name
    for a mixture, so that a run adopted into a sweep later can be checked against the data that
    sweep holds (empty when the data module keeps no manifests)."""
    data = getattr(trainer, "datamodule", None)
    manifests = getattr(data, "manifests", None)
    if not manifests:
        return {}
    names = ["data"] if getattr(data, "sources", None) is None else [source.name for source in data.sources]
    return {name: data_identity(manifest) for name, manifest in zip(names, manifests)}


def in_loop_evaluation_summary(trainer: pl.Trainer) -> dict[str, Any]:
    """What in-loop evaluations cost: the seconds each callback with an ``evaluation_seconds``
    attribute (e.g. eval/downstream's MultipleChoiceEval) spent, so that a run's cost shows
    what its benchmarks took out of its training time (empty when none ran)."""
    spent = {type(cb).__name__: float(cb.evaluation_seconds) for cb in trainer.callbacks
             if isinstance(getattr(cb, "evaluation_seconds", None), (int, float))}
    return {"in_loop_evaluation_seconds": spent} if spent else {}


def format_summary(summary: dict[str, Any], twin: dict[str, Any] | None = None) -> str:
    """The end-of-run block a person reads (also used by ``make demo``)."""
    val = summary["val_loss"]
    lines = ["", "=== run summary ===",
             f"steps            {summary['steps']:,}",
             f"tokens           {summary['tokens']:,}"]
    if val is None:
        lines.append(f"val loss         (no validation ran)   ln(V) = {summary['ln_vocab']:.3f}")
    else:
        lines.append(f"val loss         {val:.4f}   vs ln(V) = {summary['ln_vocab']:.3f} (uniform guess), "
                     f"{val / summary['ln_vocab']:.0%} of it")
    lines.append(f"FLOPs saved      {summary['flops_saved_pct']:.1f}% of non-embedding training FLOPs "
                 f"(predicted {100 * summary['mean_dropout_predicted']:.1f}%)"
                 + (f": {summary['non_embedding_training_flops']:.3g} of "
                    f"{summary['dense_non_embedding_training_flops']:.3g} (the blocks only, the paper's count)"
                    if "non_embedding_training_flops" in summary else ""))
    if "total_training_flops" in summary:
        heads = summary.get("early_exit_heads_per_step") or 0.0
        what = f"blocks, head and {heads:.2f} early-exit heads a step" if heads else "blocks and head"
        saved = summary["total_flops_saved_pct"]
        lines.append(f"total FLOPs      {summary['total_training_flops']:.3g} ({what}) vs "
                     f"{summary['dense_total_training_flops']:.3g} for a plain dense run: "
                     + (f"{saved:.1f}% saved" if saved >= 0 else f"{-saved:.1f}% more"))
    if twin is not None and twin.get("val_loss") is not None and val is not None:
        key = "non_embedding_training_flops" if "non_embedding_training_flops" in twin else "training_flops"
        lines.append(f"dense twin       val loss {twin['val_loss']:.4f} ({val - twin['val_loss']:+.4f} here), "
                     f"{twin[key]:.3g} vs {summary['training_flops']:.3g} non-embedding training FLOPs")
    exits = summary.get("early_exit_loss")
    if exits:
        losses = exits["val_loss"] or exits["train_loss"]
        where = "val" if exits["val_loss"] else "train"
        lines.append(f"exit losses      ({where}) " + ", ".join(f"{k}: {v:.4f}" for k, v in losses.items())
                     + f"; scale {exits['scale']:g}")
    for name, source in ((summary.get("data") or {}).get("sources") or {}).items():
        val_part = f", val loss {source['val_loss']:.4f}" if source.get("val_loss") is not None else ""
        lines.append(f"source {name:<9} {source['tokens']:,} tokens (weight {source['weight']:.3f}){val_part}")
    for name, seconds in (summary.get("in_loop_evaluation_seconds") or {}).items():
        lines.append(f"in-loop eval     {name}: {seconds:.1f} s")
    rates = summary.get("throughput")
    if rates and rates.get("tokens_per_sec") is not None:
        mfu = f"MFU {rates['mfu']:.1%}" if rates.get("mfu") is not None else f"MFU none: {rates.get('mfu_missing')}"
        lines.append(f"throughput       {rates['tokens_per_sec']:,.0f} tokens/s, {rates['flops_per_sec']:.3g} "
                     f"FLOP/s per device (validation left out); {mfu}")
    board = f"tensorboard --logdir {summary['tensorboard']}" if summary.get("tensorboard") \
        else "none (no logger: --trainer.logger false)"
    lines += [f"TensorBoard      {board}", f"checkpoint       {summary['checkpoint'] or 'none'}", ""]
    return "\n".join(lines)


__all__ = ["SUMMARY_FILE", "RunSummary", "read_twin", "flop_counts", "early_exit_summary", "mixture_summary",
           "in_loop_evaluation_summary", "format_summary"]

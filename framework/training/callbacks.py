"""Callbacks of a pretraining run: the layer-dropout schedule and its FLOP accounting,
throughput/MFU (the end-of-run summary: framework/training/run_summary.py; checkpoints:
framework/training/checkpointing/saving.py; the non-finite guard: framework/training/nonfinite.py).

Metrics they log (TensorBoard by default; `layer_dropout/*` and `flops/*` once per
optimizer step, `throughput/*` every ``trainer.log_every_n_steps`` steps):

    layer_dropout/mean_p           mean drop rate over layers at this step, p̄_t
    layer_dropout/effective_depth  Σ_ℓ (1 - p_ℓ,t): blocks a sequence passes through
    flops/executed_step            non-embedding training FLOPs this step ran (this device)
    flops/dense_step               the same step without layer dropout
    flops/saved_pct                100·(1 - Σ executed / Σ dense) since the run began
    throughput/tokens_per_sec      tokens/s over all devices
    throughput/flops_per_sec       executed FLOPs/s per device (blocks and head; mean over devices)
    throughput/mfu                 flops_per_sec / the device's peak (when known)
    early_exit/loss_K              cross-entropy at exit K this step (the exits the early-exit
                                   loss's curriculum ran; mean over micro-batches, this device)

FLOPs are counted as framework/flops.py describes (matmuls, causal attention, 3× the
forward for training) from the rows each block actually ran on.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import lightning.pytorch as pl
import torch
from lightning.fabric.utilities.throughput import get_available_flops
from lightning.pytorch.utilities import rank_zero_info

from framework.schedules import effective_depth_of, mean_dropout

if TYPE_CHECKING:
    from framework.training.module import MicroBatchStats


def log_step_metrics(trainer: pl.Trainer, metrics: dict[str, float], every: int | None = None) -> None:
    """Hand metrics of the optimizer step just finished straight to the loggers, on the
    steps Lightning logs at (``log_every_n_steps``) and under the same step number as
    ``train/loss``. ``LightningModule.log`` would do the same bookkeeping at several
    milliseconds per call and per step, a measurable share of a small model's step."""
    step = trainer.global_step - 1
    if (step + 1) % max(1, trainer.log_every_n_steps if every is None else every):
        return
    for logger in trainer.loggers:
        logger.log_metrics(metrics, step=step)


# ------------------------------------------------------------------ the step's outputs


def micro_batch_stats(outputs: Any) -> "MicroBatchStats | None":
    """What the micro-batch ran, from ``training_step``'s outputs (None when the step
    returned a bare loss, e.g. another module or a skipped step)."""
    return outputs.get("stats") if isinstance(outputs, dict) else None


def optimizer_step_finished(trainer: pl.Trainer, stats: "MicroBatchStats") -> bool:
    """Whether the micro-batch that produced ``stats`` closed its optimizer step: the
    trainer's step counter has moved past the step the micro-batch belonged to. The
    one test of a step's end in these callbacks (gradient accumulation, the epoch's
    last batch and resumed runs included)."""
    return trainer.global_step > stats.step


# --------------------------------------------------------------------------- schedule


class LayerDropoutSchedule(pl.Callback):
    """Logs the layer-dropout schedule of every optimizer step (p̄_t, effective depth)
    and keeps the run's FLOP account; installed by ``LayerDropModule.configure_callbacks``."""

    def __init__(self) -> None:
        self.tokens = 0  # this device's, since the run began (survives resume)
        self.executed = 0.0  # non-embedding FLOPs this device ran
        self.dense = 0.0  # ... and would have run without layer dropout
        self.rate_sum = 0.0  # Σ over steps of the scheduled mean rate
        self.steps = 0
        self._step_executed = 0.0
        self._step_dense = 0.0

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._trainer = trainer  # state_dict/load_state_dict need the ranks

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any,
                           batch: Any, batch_idx: int) -> None:
        stats = micro_batch_stats(outputs)
        if stats is None:
            return
        self.tokens += stats.tokens
        self._step_executed += stats.executed.blocks
        self._step_dense += stats.dense.blocks
        if optimizer_step_finished(trainer, stats):
            self._close_step(trainer, stats.rates)

    def _close_step(self, trainer: pl.Trainer, rates: tuple[float, ...]) -> None:
        self.executed += self._step_executed
        self.dense += self._step_dense
        self.rate_sum += sum(rates) / len(rates)
        self.steps += 1
        log_step_metrics(trainer, {
            "layer_dropout/mean_p": sum(rates) / len(rates),
            "layer_dropout/effective_depth": effective_depth_of(rates),
            "flops/executed_step": self._step_executed,
            "flops/dense_step": self._step_dense,
            "flops/saved_pct": 100.0 * self.saved_fraction(),
        })
        self._step_executed = self._step_dense = 0.0

    def saved_fraction(self) -> float:
        """This device's realised P̄: the share of non-embedding FLOPs not run."""
        return 1.0 - self.executed / self.dense if self.dense > 0 else 0.0

    def totals(self, trainer: pl.Trainer) -> dict[str, float]:
        """Tokens and FLOPs summed over all devices (a collective: call on every rank)."""
        local = torch.tensor([self.tokens, self.executed, self.dense], dtype=torch.float64,
                             device=trainer.strategy.root_device)
        total = trainer.strategy.reduce(local, reduce_op="sum") if trainer.world_size > 1 else local
        tokens, executed, dense = (float(v) for v in total.cpu())
        return {"tokens": tokens, "executed_flops": executed, "dense_flops": dense,
                "saved_fraction": 1.0 - executed / dense if dense > 0 else 0.0}

    def report(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> dict[str, float]:
        """P̄ realised by the masks, P̄ of the schedule over the steps run, and P̄ predicted
        by ``mean_dropout`` for the whole run (from the module's config)."""
        totals = self.totals(trainer)
        return {**totals,
                "mean_dropout_scheduled": self.rate_sum / self.steps if self.steps else 0.0,
                "mean_dropout_predicted": mean_dropout(pl_module.dropout_cfg, pl_module.model_cfg.n_layers,
                                                       trainer.max_steps)}

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        report = self.report(trainer, pl_module)
        if trainer.logger is not None and trainer.is_global_zero:
            trainer.logger.log_metrics({"layer_dropout/mean_dropout_achieved": report["saved_fraction"],
                                        "layer_dropout/mean_dropout_predicted": report["mean_dropout_predicted"]},
                                       step=trainer.global_step)
        rank_zero_info(f"layer dropout: P̄ achieved {report['saved_fraction']:.4f} "
                       f"(masks), {report['mean_dropout_scheduled']:.4f} (schedule over the steps run), "
                       f"predicted {report['mean_dropout_predicted']:.4f}")

    def state_dict(self) -> dict[str, Any]:
        return {"tokens": self.tokens, "executed": self.executed, "dense": self.dense,
                "rate_sum": self.rate_sum, "steps": self.steps, "devices": self._device_accounts()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        for key in ("tokens", "executed", "dense", "rate_sum", "steps"):
            setattr(self, key, state_dict[key])
        devices = state_dict.get("devices")
        trainer = getattr(self, "_trainer", None)
        if devices and trainer is not None:
            world, rank = trainer.world_size, trainer.global_rank
            # Same device count: each takes its own account back; otherwise the run's
            # totals are shared evenly, which keeps the global FLOPs and P̄ exact.
            own = devices[rank] if len(devices) == world else [sum(col) / world for col in zip(*devices)]
            self.tokens, self.executed, self.dense = int(round(own[0])), float(own[1]), float(own[2])

    def _device_accounts(self) -> list[list[float]]:
        """[tokens, executed, dense] of every device. Lightning writes rank 0's callback
        state only, but the masks, hence the FLOPs, differ per device. A collective:
        Lightning builds a checkpoint on every rank, so every rank reaches it."""
        local = [float(self.tokens), self.executed, self.dense]
        trainer = getattr(self, "_trainer", None)
        if trainer is None or trainer.world_size == 1:
            return [local]
        strategy = trainer.strategy
        gathered = strategy.all_gather(torch.tensor(local, dtype=torch.float64, device=strategy.root_device))
        return gathered.reshape(trainer.world_size, 3).cpu().tolist()


# ------------------------------------------------------------------------- early exit


class EarlyExitLosses(pl.Callback):
    """Logs ``early_exit/loss_K`` for every exit the early-exit loss ran at this step, and
    keeps the last logged values for the summary; installed by the module when the loss is on."""

    def __init__(self) -> None:
        self._sums: dict[int, torch.Tensor] = {}
        self._counts: dict[int, int] = {}
        self.last: dict[int, float] = {}

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any,
                           batch: Any, batch_idx: int) -> None:
        stats = micro_batch_stats(outputs)
        if stats is None:
            return
        for exit, loss in stats.exit_losses.items():  # tensors: no device sync until logged
            self._sums[exit] = self._sums[exit] + loss if exit in self._sums else loss
            self._counts[exit] = self._counts.get(exit, 0) + 1
        if not optimizer_step_finished(trainer, stats):
            return
        step = trainer.global_step - 1
        if (step + 1) % max(1, trainer.log_every_n_steps) == 0 and self._sums:
            means = {exit: float(total) / self._counts[exit] for exit, total in sorted(self._sums.items())}
            self.last.update(means)
            log_step_metrics(trainer, {f"early_exit/loss_{exit}": value for exit, value in means.items()})
        self._sums, self._counts = {}, {}


# ------------------------------------------------------------------------- throughput


class Throughput(pl.Callback):
    """Tokens/s and MFU from the FLOPs each step executed.

    Args:
        peak_flops_per_device: the device's dense peak (FLOP/s) for MFU, e.g. 989.5e12
            for an H200 in bf16. Lightning recognises few device names (a plain
            "NVIDIA H200" is not among them) so it is settable; without it, Lightning's
            table is asked and MFU is left out when it has no answer (CPUs); the run's
            summary then says so and why.
    """

    def __init__(self, peak_flops_per_device: float | None = None) -> None:
        if peak_flops_per_device is not None and not peak_flops_per_device > 0:
            raise ValueError(f"peak_flops_per_device={peak_flops_per_device!r} is invalid: must be positive")
        self.peak = peak_flops_per_device
        self._reset_window()
        # The whole run (this fit), for the summary: the windows above cover only logged steps.
        self._run_start: float | None = None
        self._run_seconds = 0.0
        self._run_tokens = 0
        self._run_flops = 0.0
        # What an earlier fit trained: [seconds, tokens over all devices, FLOPs per device],
        # kept in the checkpoints, for a resumed run that trains nothing (only its export was left).
        self._earlier: list[float] | None = None

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._trainer = trainer  # state_dict needs the ranks

    def _reset_window(self) -> None:
        self._start: float | None = None
        self._tokens = 0
        self._flops = 0.0
        self._paused_at: float | None = None

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.peak is None and trainer.strategy.root_device.type == "cuda":
            dtype = torch.bfloat16 if "bf16" in str(trainer.precision) else torch.float32
            self.peak = get_available_flops(trainer.strategy.root_device, dtype)

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        if self._start is None:
            self._start = self._now(trainer)
        if self._run_start is None:
            self._run_start = self._start

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any,
                           batch: Any, batch_idx: int) -> None:
        stats = micro_batch_stats(outputs)
        if stats is None or self._start is None:
            return
        self._tokens += stats.tokens
        self._flops += stats.executed.total
        self._run_tokens += stats.tokens
        self._run_flops += stats.executed.total
        every = max(1, trainer.log_every_n_steps)
        if not (optimizer_step_finished(trainer, stats) and trainer.global_step % every == 0):
            return
        flops = self._mean_over_devices(trainer, self._flops)  # before any early return: a collective
        elapsed = self._now(trainer) - self._start
        if elapsed <= 0:
            return
        metrics = {"throughput/tokens_per_sec": self._tokens * trainer.world_size / elapsed,
                   "throughput/flops_per_sec": flops / elapsed}
        if self.peak:
            metrics["throughput/mfu"] = metrics["throughput/flops_per_sec"] / self.peak
        log_step_metrics(trainer, metrics, every=1)  # already once per window
        self._reset_window()

    @staticmethod
    def _mean_over_devices(trainer: pl.Trainer, flops: float) -> float:
        """The devices' mean: each drew its own masks, so each executed other FLOPs. (A
        collective: every rank closes a window on the same steps.)"""
        if trainer.world_size == 1:
            return flops
        local = torch.tensor(flops, dtype=torch.float64, device=trainer.strategy.root_device)
        return float(trainer.strategy.reduce(local, reduce_op="mean"))

    # Validation is not training throughput: the window stops while it runs.
    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.training and self._start is not None:
            self._paused_at = self._now(trainer)

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._paused_at is not None and self._start is not None:
            paused = self._now(trainer) - self._paused_at
            self._start += paused
            if self._run_start is not None:
                self._run_start += paused
            self._paused_at = None

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._run_start is not None:
            self._run_seconds = self._now(trainer) - self._run_start

    def _totals(self, trainer: pl.Trainer) -> list[float]:
        """[seconds, tokens over all devices, mean FLOPs per device] of this fit's training
        so far; those of the earlier fit when this one trained nothing (a collective)."""
        flops = self._mean_over_devices(trainer, self._run_flops)
        if self._run_start is None:
            return list(self._earlier or [0.0, 0.0, 0.0])
        seconds = self._run_seconds or (self._now(trainer) - self._run_start)  # still training: so far
        return [seconds, float(self._run_tokens * trainer.world_size), flops]

    def state_dict(self) -> dict[str, Any]:
        trainer = getattr(self, "_trainer", None)  # every rank builds a checkpoint: the collective is safe
        return {"trained": self._totals(trainer)} if trainer is not None else {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        trained = state_dict.get("trained")
        if isinstance(trained, list) and len(trained) == 3:
            self._earlier = [float(value) for value in trained]

    def run_figures(self, trainer: pl.Trainer) -> dict[str, Any]:
        """Tokens/s, FLOP/s per device and MFU over the whole fit, validation left out (over
        the fit before, for a resumed run that trained nothing); MFU is None with the
        reason when the device's peak is unknown (a collective: every rank calls it)."""
        seconds, tokens, flops = self._totals(trainer)
        figures: dict[str, Any] = {
            "tokens_per_sec": tokens / seconds if seconds > 0 else None,
            "flops_per_sec": flops / seconds if seconds > 0 else None,
            "peak_flops_per_device": self.peak, "mfu": None}
        if self.peak and figures["flops_per_sec"] is not None:
            figures["mfu"] = figures["flops_per_sec"] / self.peak
        elif not self.peak:
            device = trainer.strategy.root_device.type
            figures["mfu_missing"] = (f"no peak FLOP/s known for this {device} device "
                                      "(set --throughput.peak_flops_per_device)")
        return figures

    @staticmethod
    def _now(trainer: pl.Trainer) -> float:
        if trainer.strategy.root_device.type == "cuda":
            torch.cuda.synchronize(trainer.strategy.root_device)
        return time.perf_counter()


__all__ = [
    "micro_batch_stats",
    "optimizer_step_finished",
    "LayerDropoutSchedule",
    "EarlyExitLosses",
    "Throughput",
]

"""The LightningModule of pretraining: a Decoder trained with scheduled layer dropout.

One optimizer step, as the paper describes it (§3, Table A.2):

    rates  = dropout_rates(cfg, L, t, T)          t = trainer.global_step, T = trainer.max_steps
    plan   = plan(cfg, rates, B, StepKey(seed, rank, t, micro-batch))   masks, r_train = 1/ρ
    h      = decoder.hidden(inputs, plan=plan)   each block runs on its kept rows only
    loss   = chunked cross-entropy of decoder.logits(h) against the targets
             (+ the early-exit loss at the step's exits, framework/early_exit_loss.py)

``training_step`` returns ``{"loss": loss, "stats": MicroBatchStats}``: what the
micro-batch ran (its step, rates, drop plan and FLOPs). The callbacks
(framework/training/callbacks.py) read that from their ``outputs``; nothing passes through
module attributes. Masks need no saved state: they derive from (seed, global rank,
step, micro-batch, layer) alone, so a resumed run draws exactly the masks the
uninterrupted one would have drawn.

The Decoder is built in ``configure_model`` so that a sharding strategy can create it
on the meta device and shard it block by block before any weight is materialised.
Nothing here assumes one process: the rank comes from ``self.global_rank`` and the
micro-batch index from the batch index modulo ``accumulate_grad_batches``.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import asdict, dataclass
from typing import Any

import lightning.pytorch as pl
import torch
from torchmetrics.aggregation import MeanMetric

from framework.checkpoint import CKPT_KEY, Checkpoint
from framework.config import (EarlyExitLossConfig, LayerDropoutConfig, ModelConfig, ParametrizationConfig,
                              PositiveInt, check)
from framework.early_exit_loss import check_exits, configured_exits, exit_weights
from framework.flops import Flops, dense_step_flops, executed_step_flops
from framework.layer_dropout import DropPlan, StepKey, plan
from framework.model.loss import LogitWatch, chunked_cross_entropy, exit_cross_entropies
from framework.training.lr_schedule import LRScheduleConfig, schedule_for
from framework.families.registry import build_decoder
from framework.model.decoder import Decoder
from framework.training.init_from import initial_checkpoint, load_initial_weights
from framework.training.parametrization import init_decoder_, model_multipliers, param_groups
from framework.schedules import dropout_rates
from framework.training.health import is_health_step

# ModelConfig fields that may differ between a checkpoint and the run resuming it:
# kernel choice and context limit change no weight and no function of the weights.
RUNTIME_FIELDS = ("attention", "max_seq_len", "init_std")
CHECKPOINT_FORMAT = 1


@dataclass(frozen=True)
class MicroBatchStats:
    """What one training micro-batch ran, returned by ``training_step`` as
    ``outputs["stats"]``: the callbacks turn it into metrics, FLOPs and MFU.

    ``step`` is the optimizer step the micro-batch belongs to (the schedule position
    t of ``total_steps``): once ``trainer.global_step`` has moved past it at the end
    of the batch, that optimizer step is complete.
    """

    step: int
    total_steps: int
    micro_batch: int
    batch_size: int
    seq_len: int
    rates: tuple[float, ...]
    plan: DropPlan | None  # None: nothing dropped, every block on every row
    executed: Flops
    dense: Flops
    exit_losses: dict[int, torch.Tensor] = dataclasses.field(default_factory=dict)  # detached, per exit K
    max_logit: torch.Tensor | None = None  # on the steps training health logs at (a device scalar)

    @property
    def tokens(self) -> int:
        return self.batch_size * self.seq_len

    @property
    def kept_counts(self) -> list[tuple[int, int]]:
        """(attention rows, FFN rows) each layer ran on."""
        if self.plan is None:
            return [(self.batch_size, self.batch_size)] * len(self.rates)
        return self.plan.kept_counts()


class LayerDropModule(pl.LightningModule):
    """Pretrains a ``Decoder`` with layer dropout, µP/CompleteP and a warmup-decay LR.

    Args:
        decoder: the model's shape; ``logit_multiplier`` and ``residual_multiplier`` are
            derived from ``parametrization`` (leave them at 1).
        layer_dropout: rates over depth and time, mask granularity, r_train, seed.
        parametrization: Table A.2's transfer rules (``complete_p``) or ``standard``.
        lr_schedule: warmup, then linear-to-zero or cosine decay.
        early_exit_loss: LayerSkip's loss at early exits (off unless ``scale`` > 0).
        loss_chunk_tokens: tokens per chunk of the cross-entropy (bounds logits memory).
        activation_checkpointing: recompute each block's activations in backward.
        compile: torch.compile each block.
        init_from: a checkpoint whose weights start the run (a Hugging Face folder or a
            layerdrop checkpoint; framework/training/init_from.py): continued pretraining. The
            decoder must be its model, and its own parametrization base (m_d = m_L = 1).
            ``self.init_from`` holds it opened (framework.checkpoint.Checkpoint).
    """

    def __init__(self, decoder: ModelConfig,
                 layer_dropout: LayerDropoutConfig = LayerDropoutConfig(),
                 parametrization: ParametrizationConfig = ParametrizationConfig(),
                 lr_schedule: LRScheduleConfig = LRScheduleConfig(),
                 early_exit_loss: EarlyExitLossConfig = EarlyExitLossConfig(),
                 loss_chunk_tokens: PositiveInt = 4096, activation_checkpointing: bool = False,
                 compile: bool = False, init_from: str | None = None) -> None:
        super().__init__()
        check("loss_chunk_tokens", loss_chunk_tokens, PositiveInt)
        explicit = layer_dropout.distribution
        if isinstance(explicit, tuple) and len(explicit) != decoder.n_layers:
            raise ValueError(f"layer_dropout.distribution={list(explicit)!r} is invalid: an explicit list needs "
                             f"one rate per layer ({decoder.n_layers})")
        check_exits(early_exit_loss, decoder.n_layers)
        # The configs are frozen and were validated when built: kept as given.
        self.model_cfg = with_parametrization(decoder, parametrization)
        # The opened checkpoint (read once: the model check here, the tokenizer check, the weights at fit start).
        self.init_from = initial_checkpoint(init_from) if init_from is not None else None
        if self.init_from is not None:
            check_initial_model(self.init_from, self.model_cfg)
        self.dropout_cfg = layer_dropout
        self.param_cfg = parametrization
        self.lr_cfg = lr_schedule
        self.exit_cfg = early_exit_loss
        self.loss_chunk_tokens = loss_chunk_tokens
        self.activation_checkpointing = activation_checkpointing
        self.compile_blocks = compile
        # Plain containers only: the whole checkpoint must load with weights_only=True.
        self.save_hyperparameters({
            "decoder": self.model_cfg.to_dict(), "layer_dropout": asdict(layer_dropout),
            "parametrization": asdict(self.param_cfg), "lr_schedule": asdict(self.lr_cfg),
            "early_exit_loss": asdict(early_exit_loss),
            "loss_chunk_tokens": loss_chunk_tokens, "activation_checkpointing": activation_checkpointing,
            "compile": compile, "init_from": init_from,
        })
        self.model: Decoder | None = None
        self.val_loss = MeanMetric()
        # One per exit the loss may use: validation measures all of them, whatever the curriculum.
        self.val_exit_loss = torch.nn.ModuleDict({str(k): MeanMetric()
                                                  for k in configured_exits(early_exit_loss, decoder.n_layers)})
        self._init_after_materialize = False

    # ------------------------------------------------------------------ model

    def configure_model(self) -> None:
        if self.model is not None:  # Lightning calls this once per fit/validate
            return
        self.model = build_decoder(self.model_cfg)
        if self.model.embed.weight.is_meta:
            # The sharding strategy materialises the weights after this hook with the
            # modules' own reset_parameters(); Table A.2's init comes in on_fit_start.
            self._init_after_materialize = True
        else:
            from framework.strategies import full_parameters  # ZeRO-3 partitions weights at creation

            with full_parameters(self.model):
                init_decoder_(self.model, self.param_cfg)
        self._parallelize()

    def _parallelize(self) -> None:
        from framework.strategies import mixed_precision_of, parallelize

        self.model = parallelize(self.model, device_mesh=getattr(self, "device_mesh", None),
                                 mp_policy=mixed_precision_of(self),
                                 activation_checkpointing=self.activation_checkpointing,
                                 compile=self.compile_blocks)

    def on_fit_start(self) -> None:
        if self._init_after_materialize:
            self.model.init_weights()  # restores the ALiBi slopes (buffers) too
            init_decoder_(self.model, self.param_cfg)
            self._init_after_materialize = False
        if self.init_from is not None and not self.trainer.ckpt_path:  # a resumed run restores its own weights
            load_initial_weights(self.model, self.init_from)

    def configure_callbacks(self) -> list[pl.Callback]:
        from framework.training.callbacks import EarlyExitLosses, LayerDropoutSchedule
        from framework.training.health import TrainingHealth
        from framework.training.data.source_tokens import SourceTokens

        return [LayerDropoutSchedule(), TrainingHealth(), SourceTokens(),
                *([EarlyExitLosses()] if self.val_exit_loss else [])]

    def setup(self, stage: str) -> None:
        # a data mixture: one validation loss per source (its own val split), beside the weighted total
        sources = getattr(self.trainer.datamodule, "sources", None) if self.trainer.datamodule is not None else None
        self.val_sources = sources or []
        self.val_source_loss = torch.nn.ModuleList([MeanMetric() for _ in self.val_sources])

    # --------------------------------------------------------------- training

    def training_step(self, batch: tuple[torch.Tensor, ...], batch_idx: int) -> dict[str, Any]:
        inputs, targets = batch[:2]  # a mixture's batch has each row's source third (SourceTokens counts them)
        step, total = self.schedule_position()
        rates = dropout_rates(self.dropout_cfg, self.model_cfg.n_layers, step, total)
        micro_batch = batch_idx % self.trainer.accumulate_grad_batches
        drop = self.drop_plan(rates, inputs.shape[0], step, micro_batch)
        exits = exit_weights(self.exit_cfg, self.model_cfg.n_layers, step, total)
        watch = LogitWatch(self.model.logits) if is_health_step(self.trainer, step) else None
        objective, final, per_exit = self.losses(inputs, targets, drop, exits, logits_fn=watch)
        # The final layer's loss, comparable with a run without the early-exit loss.
        self.log("train/loss", final, prog_bar=True, on_step=True, on_epoch=False)
        stats = self._stats(inputs, step, total, micro_batch, rates, drop, per_exit)
        if watch is not None:
            stats = dataclasses.replace(stats, max_logit=watch.max)
        return {"loss": objective, "stats": stats}

    def schedule_position(self) -> tuple[int, int]:
        """(t, T): the optimizer step this micro-batch belongs to, and the run's length.
        ``configure_optimizers`` has refused a run without ``max_steps`` before this."""
        return self.trainer.global_step, self.trainer.max_steps

    def drop_plan(self, rates: list[float], batch_size: int, step: int, micro_batch: int) -> DropPlan | None:
        """The masks of one micro-batch; None (the dense path, no gather) when nothing drops."""
        if not any(p > 0 for p in rates):
            return None
        key = StepKey(self.dropout_cfg.seed, self.global_rank, step, micro_batch)
        return plan(self.dropout_cfg, rates, batch_size, key)

    def loss(self, inputs: torch.Tensor, targets: torch.Tensor, drop: DropPlan | None = None,
             exits: dict[int, float] | None = None) -> torch.Tensor:
        """The training objective: the final layer's cross-entropy, plus Σ weight·loss at
        ``exits`` ({K: weight}, as ``exit_weights`` gives them for the step)."""
        return self.losses(inputs, targets, drop, exits)[0]

    def losses(self, inputs: torch.Tensor, targets: torch.Tensor, drop: DropPlan | None = None,
               exits: dict[int, float] | None = None, logits_fn: Any = None,
               ) -> tuple[torch.Tensor, torch.Tensor, dict[int, torch.Tensor]]:
        """(objective, final layer's loss, {K: loss at exit K}) of one forward; ``logits_fn``
        (a LogitWatch) replaces the head for the final layer's loss."""
        head = logits_fn or self.model.logits
        if not exits:
            hidden = self.model.hidden(inputs, plan=drop)
            final = chunked_cross_entropy(hidden, targets, head, chunk_tokens=self.loss_chunk_tokens)
            return final, final, {}
        states = self.model.hidden(inputs, plan=drop, all_layers=True)
        final = chunked_cross_entropy(states[-1], targets, head, chunk_tokens=self.loss_chunk_tokens)
        per_exit = exit_cross_entropies(states, targets, self.model.logits, exits, chunk_tokens=self.loss_chunk_tokens)
        objective = final + sum(weight * per_exit[exit] for exit, weight in exits.items())
        return objective, final, per_exit

    def _stats(self, inputs: torch.Tensor, step: int, total: int, micro_batch: int, rates: list[float],
               drop: DropPlan | None, exit_losses: dict[int, torch.Tensor]) -> MicroBatchStats:
        batch, seq = inputs.shape
        kept = [(batch, batch)] * self.model_cfg.n_layers if drop is None else drop.kept_counts()
        heads = len(exit_losses)
        return MicroBatchStats(step=step, total_steps=total, micro_batch=micro_batch, batch_size=batch,
                               seq_len=seq, rates=tuple(rates), plan=drop,
                               executed=executed_step_flops(self.model_cfg, kept, seq, batch_size=batch,
                                                            exit_heads=heads),
                               dense=dense_step_flops(self.model_cfg, batch, seq, exit_heads=heads),
                               exit_losses={k: v.detach() for k, v in exit_losses.items()})

    # ------------------------------------------------------------- validation

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int,
                        dataloader_idx: int = 0) -> None:
        inputs, targets = batch
        # r_eval = 1: every block on every sequence; every configured exit, unweighted.
        exits = {int(k): 1.0 for k in self.val_exit_loss}
        _, loss, per_exit = self.losses(inputs, targets, exits=exits)
        if self.val_sources:
            self.val_source_loss[dataloader_idx].update(loss, weight=targets.numel())
        else:
            self.val_loss.update(loss, weight=targets.numel())
        for exit, value in per_exit.items():
            self.val_exit_loss[str(exit)].update(value, weight=targets.numel())

    def on_validation_epoch_end(self) -> None:
        if self.val_sources:
            # the mixture's loss: each source's own (token-weighted, synced over ranks), weighted as in training
            per_source = [metric.compute() for metric in self.val_source_loss]
            for source, metric, value in zip(self.val_sources, self.val_source_loss, per_source):
                self.log(f"val/loss/{source.name}", value)
                metric.reset()
            loss = sum(source.weight * value for source, value in zip(self.val_sources, per_source))
        else:
            loss = self.val_loss.compute()  # token-weighted mean, synced over ranks
            self.val_loss.reset()
        self.log("val/loss", loss, prog_bar=True)
        self.log("val/ppl", torch.exp(loss))
        for exit, metric in self.val_exit_loss.items():
            self.log(f"val/early_exit/loss_{exit}", metric.compute())
            metric.reset()

    # -------------------------------------------------------------- optimizer

    def optimizer_step(self, epoch: int, batch_idx: int, optimizer: Any, optimizer_closure: Any = None) -> None:
        """The update, unless the loss or the gradient norm is non-finite on any rank:
        then no rank updates (framework/training/nonfinite.py)."""
        from framework.training.nonfinite import guard_of

        loss = optimizer_closure()  # forward + backward of the step's last micro-batch
        if guard_of(self.trainer).skip_step(self.trainer, loss, optimizer, batch_idx):
            optimizer.zero_grad(set_to_none=True)
            return
        optimizer.step(closure=lambda: loss)  # the precision plugin's hooks and clipping still run

    def configure_optimizers(self) -> dict[str, Any]:
        total = self.trainer.max_steps
        if total is None or total < 1:
            raise ValueError(f"trainer.max_steps={total!r} is invalid: pretraining needs the run length "
                             "(LR decay and the weight-decay timescale τ_EMA depend on it); "
                             "set --trainer.max_steps")
        # λ = B/(η·τ_EMA·D) depends on B/D only, which is 1/max_steps for any batch size.
        groups = param_groups(self.model, self.param_cfg, total_tokens=float(total), batch_tokens=1.0)
        optimizer = torch.optim.AdamW(groups, betas=self.param_cfg.betas)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule_for(self.lr_cfg, total))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    # ------------------------------------------------------------ checkpoints

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint[CKPT_KEY] = {**checkpoint.get(CKPT_KEY, {}),  # callbacks' entries (the tokenizer) first
            "format": CHECKPOINT_FORMAT,
            "model_config": self.model_cfg.to_dict(),
            "layer_dropout": asdict(self.dropout_cfg),
            "parametrization": asdict(self.param_cfg),
        }
        if self.attached_trainer() is not None:
            from framework.checkpoint.resume import world_of

            checkpoint[CKPT_KEY]["world"] = world_of(self.trainer)

    def attached_trainer(self) -> pl.Trainer | None:
        """The trainer, or None for a module used alone (a checkpoint saved or read outside fit)."""
        try:
            return self.trainer
        except RuntimeError:  # Lightning's "not attached to a Trainer"
            return None

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        saved = checkpoint.get(CKPT_KEY, {}).get("model_config")
        if not isinstance(saved, dict):
            raise ValueError(f"checkpoint has no {CKPT_KEY!r} model config: it was not written by layerdrop pretrain")
        check_same_model(saved, self.model_cfg.to_dict())
        from framework.checkpoint.resume import apply_recipe_optimizer_settings, check_same_world

        if self.attached_trainer() is not None:
            check_same_world(checkpoint[CKPT_KEY].get("world"), self.trainer)

        # The recipe's LR, schedule and weight decay win over the saved ones (else a lower
        # LR after a divergence would be silently ignored); said in one line.
        apply_recipe_optimizer_settings(self, checkpoint)


def with_parametrization(decoder: ModelConfig, pcfg: ParametrizationConfig) -> ModelConfig:
    """``decoder`` with the forward multipliers the parametrization prescribes.

    A recipe that sets a multiplier by hand to something else is an error, not an
    override that is silently dropped.
    """
    derived = model_multipliers(pcfg, decoder)
    for key, value in derived.items():
        given = getattr(decoder, key)
        if given != 1.0 and not math.isclose(given, value, rel_tol=1e-9):
            raise ValueError(f"decoder.{key}={given!r} is invalid: it is derived from the parametrization "
                             f"(kind={pcfg.kind!r} gives {value!r}); leave it at 1.0")
    return dataclasses.replace(decoder, **derived)


def check_initial_model(ckpt: Checkpoint, model_cfg: ModelConfig) -> None:
    """``model.init_from``'s model must be the configured one, with multipliers 1."""
    path = str(ckpt.path)
    for key in ("logit_multiplier", "residual_multiplier"):
        if getattr(model_cfg, key) != 1.0:
            raise ValueError(f"model.init_from={path!r} needs the imported model to be its own parametrization base "
                             f"(m_d = m_L = 1), but {key}={getattr(model_cfg, key)!r}: set "
                             f"parametrization.d_base={model_cfg.d_model} and n_layers_base={model_cfg.n_layers}")
    saved = ckpt.model_config.to_dict()
    different = [f"{k}: {saved[k]!r} there, {v!r} here" for k, v in model_cfg.to_dict().items()
                 if k not in RUNTIME_FIELDS and saved.get(k) != v]
    if different:
        raise ValueError(f"model.init_from={path!r} holds another model than model.decoder ({'; '.join(different)})")


def check_same_model(saved: dict[str, Any], configured: dict[str, Any]) -> None:
    """Refuse to resume weights into a model of another shape or function."""
    try:  # a checkpoint written before a field existed holds its default
        saved = ModelConfig.from_dict(saved).to_dict()
    except (TypeError, ValueError):
        pass
    keys = sorted((set(saved) | set(configured)) - set(RUNTIME_FIELDS))
    different = [f"{k}: checkpoint {saved.get(k)!r}, config {configured.get(k)!r}"
                 for k in keys if saved.get(k) != configured.get(k)]
    if different:
        raise ValueError("cannot resume: the checkpoint's model differs from the configured one ("
                         + "; ".join(different) + ")")


__all__ = ["LayerDropModule", "MicroBatchStats", "with_parametrization", "check_same_model"]

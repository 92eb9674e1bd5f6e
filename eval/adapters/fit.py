"""`layerdrop adapters fit`: train exit adapters by self-distillation from the frozen backbone.

The adapters (eval/adapters/exit_adapters.py) learn from the same frozen model's final
layer:

    loss = mean over exits k of  mean over tokens t of  KL(p_full(·|t) ‖ p_k(·|t))

(per token, not per sequence). The backbone never receives a gradient and is not in
the optimizer. Training runs in a LightningModule under the pretraining stack's
Trainer, strategies (framework/strategies/) and token data (framework/training/data/data_module.py).
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path
from typing import Any, Callable, Sequence

import lightning.pytorch as pl
import torch
import torch.nn.functional as F

from eval import options
from eval.adapters.exit_adapters import (INITS, WEIGHTS_FILE, ExitAdapters, check_exits, default_exits, layer_list,
                                         load_backbone, save_adapters)
from framework.command_parser import CommandParser
from framework.strategies import STRATEGIES
from framework.model.loss import chunked_sum
from framework.training.lr_schedule import LRScheduleConfig, schedule_for
from framework.model.decoder import Decoder

# Strategies whose frozen, replicated backbone needs nothing special: the optimizer and
# the gradient all-reduce only see the adapters. "auto": single on one device, else ddp.
FIT_STRATEGIES = ("auto", *(name for name, entry in STRATEGIES.items() if entry.replicates_parameters))


def distillation_kl(student_logits: torch.Tensor, teacher_logprobs: torch.Tensor) -> torch.Tensor:
    """KL(teacher ‖ student) summed over the vocabulary, averaged over tokens."""
    student = F.log_softmax(student_logits.float(), dim=-1).flatten(0, -2)
    teacher = teacher_logprobs.flatten(0, -2)
    return F.kl_div(student, teacher, log_target=True, reduction="sum") / teacher.shape[0]


def chunked_distillation_kl(student_hidden: torch.Tensor, teacher_hidden: torch.Tensor,
                            logits_fn: Callable[[torch.Tensor], torch.Tensor], chunk_tokens: int) -> torch.Tensor:
    """``distillation_kl`` of the logits of two residual streams [..., d], ``chunk_tokens``
    rows at a time (framework/model/loss.py's reducer): with a 128k vocabulary the logits of a
    micro-batch would be the largest tensors of the step, so only one chunk's exist at
    once, the student's recomputed in backward."""
    student = student_hidden.reshape(-1, student_hidden.shape[-1])
    teacher = teacher_hidden.reshape(-1, teacher_hidden.shape[-1])
    total = chunked_sum(lambda s_, t_: _summed_kl(s_, t_, logits_fn), student, teacher, chunk_tokens=chunk_tokens,
                        recompute=True)
    return total / student.shape[0]


def _summed_kl(student: torch.Tensor, teacher: torch.Tensor,
               logits_fn: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    with torch.no_grad():
        teacher_logprobs = F.log_softmax(logits_fn(teacher).float(), dim=-1)
    return distillation_kl(logits_fn(student), teacher_logprobs) * student.shape[0]


class AdapterModule(pl.LightningModule):
    """Trains ``ExitAdapters`` against the frozen ``backbone``'s final-layer distribution."""

    def __init__(self, backbone: Decoder, exits: Sequence[int], *, init: str = "last", lr: float = 1e-3,
                 weight_decay: float = 0.0, lr_schedule: LRScheduleConfig | None = None,
                 loss_chunk_tokens: int = 4096) -> None:
        super().__init__()
        if not lr > 0:
            raise ValueError(f"lr={lr!r} is invalid: must be > 0")
        if isinstance(loss_chunk_tokens, bool) or not isinstance(loss_chunk_tokens, int) or loss_chunk_tokens < 1:
            raise ValueError(f"loss_chunk_tokens={loss_chunk_tokens!r} is invalid: must be a positive integer")
        self.loss_chunk_tokens = loss_chunk_tokens
        self.backbone = backbone
        for param in self.backbone.parameters():
            param.requires_grad_(False)
        self.adapters = ExitAdapters(backbone.config, exits)
        self.adapters.initialise(backbone, init)
        self.lr, self.weight_decay = lr, weight_decay
        self.lr_cfg = lr_schedule or LRScheduleConfig()

    def train(self, mode: bool = True) -> "AdapterModule":
        super().train(mode)
        self.backbone.eval()  # frozen: eval behaviour whatever the Trainer asks for
        return self

    def exit_kls(self, inputs: torch.Tensor) -> dict[int, torch.Tensor]:
        # One forward: the frozen backbone (no parameter needs a gradient, so none of its
        # activations is kept) with every adapter read at its exit.
        out = self.backbone.step(inputs, exits=self.adapters.as_exits())
        return {e: chunked_distillation_kl(hidden, out.hidden, self.backbone.logits, self.loss_chunk_tokens)
                for e, hidden in out.reads.items()}

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        kls = self.exit_kls(batch[0])
        loss = torch.stack(list(kls.values())).mean()
        self.log("train/kl", loss, prog_bar=True)
        for e, kl in kls.items():
            self.log(f"train/kl_exit_{e}", kl)
        return loss

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        kls = self.exit_kls(batch[0])
        self.log("val/kl", torch.stack(list(kls.values())).mean(), prog_bar=True, sync_dist=True)

    def configure_optimizers(self) -> dict[str, Any]:
        params = [p for p in self.adapters.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(params, lr=self.lr, weight_decay=self.weight_decay)
        total = self.trainer.max_steps
        if total is None or total < 1:
            raise ValueError(f"trainer.max_steps={total!r} is invalid: adapter training needs a run length")
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule_for(self.lr_cfg, total))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


# -------------------------------------------------------------------------- CLI


def fit_parser() -> argparse.ArgumentParser:
    p = CommandParser(prog="layerdrop adapters fit",
                                description="Train Balcony-style exit adapters on a frozen backbone "
                                            "(KL to the full model's next-token distribution). "
                                            f"Layer numbering: {options.LAYERS}.")
    p.add_argument("--ckpt", required=True, help="backbone: a .ckpt from `layerdrop pretrain` or an exported folder")
    p.add_argument("--data", required=True, metavar="DIR", help="a folder made by `layerdrop prepare`")
    p.add_argument("--out", required=True, metavar="DIR", help="where adapters.safetensors + adapters.json go")
    p.add_argument("--exits", type=layer_list, default=None,
                   help="exits, e.g. 2,4,6: exit K reads the stream after blocks 0..K-1 (K in 1..L-1; default: "
                        "L/4, L/2, 3L/4)")
    p.add_argument("--init", choices=INITS, default="last",
                   help="adapter initialisation: a copy of the backbone's last block (default) or random")
    p.add_argument("--max-steps", type=int, default=200, help="optimizer steps (default 200)")
    p.add_argument("--batch-size", type=int, default=8,
                   help="sequences per device per step (default 8; the global batch is devices x nodes x this)")
    p.add_argument("--seq-len", type=int, default=None,
                   help="tokens per sequence (default: the backbone's max_seq_len)")
    p.add_argument("--lr", type=float, default=1e-3, help="AdamW learning rate (default 1e-3)")
    p.add_argument("--weight-decay", type=float, default=0.0, help="AdamW weight decay (default 0)")
    p.add_argument("--warmup-steps", type=int, default=0, help="linear warmup steps before linear decay")
    p.add_argument("--loss-chunk-tokens", type=int, default=4096,
                   help="tokens per logits chunk of the KL (bounds memory with big vocabularies; default 4096)")
    p.add_argument("--strategy", choices=FIT_STRATEGIES, default="auto",
                   help="Lightning strategy (default auto: single on one device, ddp on several: every device "
                        "holds the frozen backbone, only the adapters' gradients are all-reduced)")
    p.add_argument("--accelerator", default="auto", help="cpu, gpu or auto (default)")
    p.add_argument("--devices", type=int, default=1, help="devices per node (default 1)")
    p.add_argument("--num-nodes", type=int, default=1, help="nodes (default 1)")
    p.add_argument("--val-every", type=int, default=None, help="validate every N steps (default: at the end only)")
    p.add_argument("--val-batches", type=int, default=4, help="validation batches per check (default 4)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random init and the data order")
    p.add_argument("--overwrite", action="store_true", help="replace adapters already in --out")
    return p


def fit_main(argv: list[str] | None = None) -> int:
    parser = fit_parser()
    args = parser.parse_args(argv)
    for name in ("max_steps", "batch_size", "devices", "num_nodes", "val_batches"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')}={getattr(args, name)} is invalid: must be a positive integer")
    options.refuse_existing(parser, [Path(args.out) / WEIGHTS_FILE], args.overwrite)
    if not Path(args.data).is_dir():
        parser.error(f"--data {args.data!r} is not a folder: expected one made by `layerdrop prepare`")
    pl.seed_everything(args.seed, verbose=False)
    backbone = load_backbone(parser, args.ckpt)
    exits = args.exits if args.exits is not None else default_exits(backbone.config.n_layers)
    try:
        check_exits(exits, backbone.config.n_layers)
        module = AdapterModule(backbone, exits, init=args.init, lr=args.lr, weight_decay=args.weight_decay,
                               lr_schedule=LRScheduleConfig(warmup_steps=args.warmup_steps),
                               loss_chunk_tokens=args.loss_chunk_tokens)
        trainer = _trainer(args)
    except ValueError as err:
        parser.error(str(err))
    from framework.training.data import TokenDataModule

    from eval.inputs import with_seq_len_hint

    seq_len = args.seq_len or backbone.config.max_seq_len
    data = TokenDataModule(args.data, seq_len=seq_len, batch_size=args.batch_size, val_batches=args.val_batches,
                           seed=args.seed, model_vocab_size=backbone.config.vocab_size)
    try:  # the splits against seq_len and the vocabulary now, not after Lightning set up (and logged)
        data.setup()
    except (ValueError, FileNotFoundError) as err:
        parser.error(f"--data {args.data!r}: {with_seq_len_hint(str(err).splitlines()[0], seq_len)}")
    before = {k: v.clone() for k, v in backbone.state_dict().items()}
    with warnings.catch_warnings():  # the frozen backbone is in eval mode on purpose (AdapterModule.train)
        warnings.filterwarnings("ignore", message=r"Found \d+ module\(s\) in eval mode")
        trainer.fit(module, datamodule=data)
    _check_frozen(before, backbone)
    if trainer.is_global_zero:
        meta = {"backbone": str(Path(args.ckpt).resolve()), "init": args.init, "steps": args.max_steps,
                "model": backbone.config.to_dict(),
                "val_kl": float(trainer.callback_metrics.get("val/kl", float("nan")))}
        save_adapters(module.adapters.cpu(), args.out, meta, overwrite=args.overwrite)
        print(f"wrote {Path(args.out) / WEIGHTS_FILE} (exits {module.adapters.exits}, "
              f"val KL {meta['val_kl']:.4f})")
    return 0


def _trainer(args: argparse.Namespace) -> pl.Trainer:
    from lightning.pytorch.loggers import TensorBoardLogger

    from framework.strategies import build_strategy, precision_for, resolve_accelerator
    from framework.training.progress import StepProgressBar, StepProgressLines

    name = args.strategy
    if name == "auto":
        name = "ddp" if args.devices * args.num_nodes > 1 else "single"
    strategy = build_strategy(name, accelerator=args.accelerator, devices=args.devices, num_nodes=args.num_nodes)
    # Steps out of --max-steps (Lightning's own bar reads "Epoch 0/-2"); in a log, lines.
    on_terminal = sys.stdout.isatty()
    display = StepProgressBar() if on_terminal else StepProgressLines(every=10.0, loss="train/kl")
    return pl.Trainer(callbacks=[display], enable_progress_bar=on_terminal,accelerator=resolve_accelerator(args.accelerator), devices=args.devices,
                      num_nodes=args.num_nodes, strategy=strategy, precision=precision_for(args.accelerator),
                      max_steps=args.max_steps, val_check_interval=args.val_every or args.max_steps,
                      check_val_every_n_epoch=None, limit_val_batches=args.val_batches,
                      enable_checkpointing=False,  # only the adapters are saved, by fit_main
                      logger=TensorBoardLogger(args.out, name="logs"), enable_model_summary=False,
                      log_every_n_steps=max(1, min(50, args.max_steps // 10)))


def _check_frozen(before: dict[str, torch.Tensor], backbone: Decoder) -> None:
    changed = [k for k, v in backbone.state_dict().items() if not torch.equal(v.cpu(), before[k].cpu())]
    if changed:
        raise RuntimeError(f"the frozen backbone changed during adapter training: {changed[:3]}")


if __name__ == "__main__":
    sys.exit(fit_main())

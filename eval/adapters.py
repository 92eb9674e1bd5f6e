"""Balcony-style exit adapters on a frozen backbone: `layerdrop adapters fit|eval`.

Balcony (Jamialahmadi et al., 2025; paper §8.2.1) keeps the pretrained model as it is
and adds, at each chosen exit layer k, ONE extra transformer block of the backbone's
own architecture. An exit's prediction is

    logits_k = head(norm(adapter_k(h_k)))        h_k = residual stream after blocks 0..k-1

with the backbone's final norm and unembedding, shared by every exit and frozen. The
adapters learn by self-distillation from the same frozen model's final layer:

    loss = mean over exits k of  mean over tokens t of  KL(p_full(·|t) ‖ p_k(·|t))

(per token, not per sequence). The backbone never receives a gradient and is not in
the optimizer; only the adapters' weights are saved (``adapters.safetensors`` plus
``adapters.json`` naming the backbone and the exits).

Training runs in a LightningModule under the pretraining stack's Trainer, strategies
(framework/strategies.py) and token data (framework/data.py).
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import lightning.pytorch as pl
import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from framework.atomic_write import write_json
from eval import options
from framework.checkpoint import CheckpointError, load_decoder
from framework.command_parser import CommandParser
from framework.config import ModelConfig
from framework.loss import IGNORE_INDEX, chunked_sum, counted_tokens, inference_chunk_tokens
from framework.lr_schedule import LRScheduleConfig, schedule_for
from framework.families import new_block
from framework.model import Decoder

WEIGHTS_FILE = "adapters.safetensors"
META_FILE = "adapters.json"
INITS = ("last", "random")
# Strategies whose frozen, replicated backbone needs nothing special: the optimizer and
# the gradient all-reduce only see the adapters. "auto": single on one device, else ddp.
FIT_STRATEGIES = ("auto", "single", "ddp", "deepspeed_stage_2")


def check_exits(exits: Sequence[int], num_layers: int) -> list[int]:
    """Sorted, distinct exits in 1..L-1 (an exit at L would distil the model into itself)."""
    bad = [e for e in exits if isinstance(e, bool) or not isinstance(e, int) or not 1 <= e <= num_layers - 1]
    if bad or not exits:
        raise ValueError(f"exits={list(exits)} is invalid: give at least one exit layer, each in "
                         f"1..{num_layers - 1} (the backbone has {num_layers} layers)")
    return sorted(set(exits))


def default_exits(num_layers: int) -> list[int]:
    """A quarter, half and three quarters of the depth (as in the paper's Fig. 7)."""
    return sorted({min(num_layers - 1, max(1, round(num_layers * f))) for f in (0.25, 0.5, 0.75)})


class ExitAdapters(nn.Module):
    """One extra ``Block`` per exit layer; the norm and head are the backbone's."""

    def __init__(self, cfg: ModelConfig, exits: Sequence[int]) -> None:
        super().__init__()
        self.exits = check_exits(list(exits), cfg.n_layers)
        # Adapter i is layer n_layers + i of a KV cache made with extra_layers=len(exits).
        self.blocks = nn.ModuleDict({str(e): new_block(cfg, cfg.n_layers + i) for i, e in enumerate(self.exits)})
        self.init_std = cfg.init_std

    @torch.no_grad()
    def initialise(self, backbone: Decoder, how: str = "last") -> None:
        """Copy the backbone's last block into every adapter, or draw fresh weights."""
        if how not in INITS:
            raise ValueError(f"init={how!r} is invalid: allowed: {', '.join(INITS)}")
        for block in self.blocks.values():
            if how == "last":
                block.load_state_dict(backbone.blocks[-1].state_dict())
                continue
            for module in block.modules():
                if isinstance(module, nn.Linear):
                    nn.init.normal_(module.weight, std=self.init_std)
                    if module.bias is not None:
                        nn.init.zeros_(module.bias)
                elif isinstance(module, nn.LayerNorm):
                    nn.init.ones_(module.weight)
                    nn.init.zeros_(module.bias)

    def exit_hidden(self, states: Sequence[torch.Tensor], bias: torch.Tensor | None) -> dict[int, torch.Tensor]:
        """``states[k-1]`` (the stream after block k-1) through adapter k."""
        return {e: self.blocks[str(e)](states[e - 1], bias) for e in self.exits}

    def exit_logits(self, backbone: Decoder, states: Sequence[torch.Tensor], bias: torch.Tensor | None
                    ) -> dict[int, torch.Tensor]:
        """Each adapter's output through the backbone's shared final norm + head."""
        return {e: backbone.logits(h) for e, h in self.exit_hidden(states, bias).items()}


def distillation_kl(student_logits: torch.Tensor, teacher_logprobs: torch.Tensor) -> torch.Tensor:
    """KL(teacher ‖ student) summed over the vocabulary, averaged over tokens."""
    student = F.log_softmax(student_logits.float(), dim=-1).flatten(0, -2)
    teacher = teacher_logprobs.flatten(0, -2)
    return F.kl_div(student, teacher, log_target=True, reduction="sum") / teacher.shape[0]


def chunked_distillation_kl(student_hidden: torch.Tensor, teacher_hidden: torch.Tensor,
                            logits_fn: Callable[[torch.Tensor], torch.Tensor], chunk_tokens: int) -> torch.Tensor:
    """``distillation_kl`` of the logits of two residual streams [..., d], ``chunk_tokens``
    rows at a time (framework/loss.py's reducer): with a 128k vocabulary the logits of a
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
        with torch.no_grad():
            states = self.backbone.hidden(inputs, all_layers=True)
        bias = self.backbone.attention_bias(inputs.shape[1], None)
        return {e: chunked_distillation_kl(hidden, states[-1], self.backbone.logits, self.loss_chunk_tokens)
                for e, hidden in self.adapters.exit_hidden(states, bias).items()}

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


# ------------------------------------------------------------------------ files


def save_adapters(adapters: ExitAdapters, out_dir: str | Path, meta: dict, *, overwrite: bool = False) -> Path:
    out_dir = Path(out_dir)
    if (out_dir / WEIGHTS_FILE).exists() and not overwrite:
        raise FileExistsError(options.exists_message(out_dir / WEIGHTS_FILE))
    out_dir.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous().cpu() for k, v in adapters.state_dict().items()}
    save_file(state, str(out_dir / WEIGHTS_FILE))
    (out_dir / META_FILE).write_text(json.dumps({"exits": adapters.exits, **meta}, indent=2) + "\n")
    return out_dir


def read_meta(path: str | Path) -> dict:
    path = Path(path)
    for name in (WEIGHTS_FILE, META_FILE):
        if not (path / name).is_file():
            raise CheckpointError(f"adapters folder {str(path)!r} has no {name} (made by `layerdrop adapters fit`)")
    return json.loads((path / META_FILE).read_text())


def load_adapters(path: str | Path, backbone: Decoder) -> tuple[ExitAdapters, dict]:
    """Adapters saved by ``save_adapters``, checked against the backbone's shape."""
    meta = read_meta(path)
    if meta.get("model") != backbone.config.to_dict():
        raise CheckpointError(f"adapters {str(path)!r} were trained for another model shape: "
                              f"{meta.get('model')} vs the backbone's {backbone.config.to_dict()}")
    adapters = ExitAdapters(backbone.config, meta["exits"]).to(backbone.embed.weight.device)
    adapters.load_state_dict(load_file(str(Path(path) / WEIGHTS_FILE)))
    return adapters.eval(), meta


# ------------------------------------------------------------------------- eval


@torch.inference_mode()
def adapter_losses(backbone: Decoder, adapters: ExitAdapters, batches: Iterable, *,
                   chunk_tokens: int | None = None) -> dict:
    """Token-averaged, at every adapter exit: cross-entropy with the adapter, and the KL
    to the full model with and without the adapter (plain early exit); the logits exist
    a chunk of tokens at a time (framework/loss.py's reducer)."""
    cfg = backbone.config
    device = backbone.embed.weight.device
    chunk_tokens = chunk_tokens or inference_chunk_tokens(cfg.vocab_size, cfg.d_model, device.type == "cuda")
    sums = {e: torch.zeros(3, dtype=torch.float64, device=device) for e in adapters.exits}
    positions = targets_counted = 0
    for inputs, targets in batches:
        inputs, targets = inputs.to(device), targets.to(device)
        states = backbone.hidden(inputs, all_layers=True)
        bias = backbone.attention_bias(inputs.shape[1], None)
        teacher, labels = states[-1].flatten(0, 1), targets.flatten()
        for e, hidden in adapters.exit_hidden(states, bias).items():
            sums[e] += chunked_sum(lambda a, p, t, y: _exit_sums(backbone.logits, a, p, t, y), hidden.flatten(0, 1),
                                   states[e - 1].flatten(0, 1), teacher, labels, chunk_tokens=chunk_tokens)
        positions += inputs.numel()
        targets_counted += counted_tokens(targets)
    if targets_counted == 0:
        raise ValueError("the evaluation data yielded no tokens: check --data, --batches and --max-tokens")
    return {"adapter_loss": {str(e): float(v[0]) / targets_counted for e, v in sums.items()},
            "adapter_kl": {str(e): float(v[1]) / positions for e, v in sums.items()},
            "plain_kl": {str(e): float(v[2]) / positions for e, v in sums.items()}}


def _exit_sums(logits_fn, adapter_hidden: torch.Tensor, plain_hidden: torch.Tensor, teacher_hidden: torch.Tensor,
               labels: torch.Tensor) -> torch.Tensor:
    """[Σ cross-entropy with the adapter, Σ KL(full ‖ adapter), Σ KL(full ‖ plain exit)] of a chunk."""
    teacher = F.log_softmax(logits_fn(teacher_hidden).float(), dim=-1)
    adapter = F.log_softmax(logits_fn(adapter_hidden).float(), dim=-1)
    plain = F.log_softmax(logits_fn(plain_hidden).float(), dim=-1)
    return torch.stack([F.nll_loss(adapter, labels, ignore_index=IGNORE_INDEX, reduction="sum"),
                        F.kl_div(adapter, teacher, log_target=True, reduction="sum"),
                        F.kl_div(plain, teacher, log_target=True, reduction="sum")]).double()


def evaluate(backbone: Decoder, adapters: ExitAdapters, batches: Iterable,
             adapter_batches: Iterable | None = None) -> dict:
    """The `adapters eval` report: plain early exit next to the adapters, per exit (two
    passes: ``batches``, then ``adapter_batches``, by default the same batches again)."""
    from eval.exits import exit_losses

    plain = exit_losses(backbone, batches)
    with_adapters = adapter_losses(backbone, adapters, batches if adapter_batches is None else adapter_batches)
    num_layers = plain["num_layers"]
    return {"num_layers": num_layers, "exits": adapters.exits, "tokens": plain["tokens"],
            "exit_loss": plain["exit_loss"],
            "plain_loss": {str(e): plain["exit_loss"][str(e)] for e in adapters.exits},
            "adapter_loss": with_adapters["adapter_loss"],
            "plain_kl": with_adapters["plain_kl"], "adapter_kl": with_adapters["adapter_kl"],
            "final_loss": plain["exit_loss"][str(num_layers)]}


# -------------------------------------------------------------------------- CLI


def _int_list(text: str) -> list[int]:
    try:
        return [int(x) for x in text.replace(";", ",").split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of layer numbers") from None


def _load_backbone(parser: argparse.ArgumentParser, path: str, device: str = "cpu") -> Decoder:
    try:
        backbone, _ = load_decoder(path, map_location=device)
    except (CheckpointError, FileNotFoundError) as err:
        parser.error(str(err))
    return backbone


def fit_parser() -> argparse.ArgumentParser:
    p = CommandParser(prog="layerdrop adapters fit",
                                description="Train Balcony-style exit adapters on a frozen backbone "
                                            "(KL to the full model's next-token distribution). "
                                            f"Layer numbering: {options.LAYERS}.")
    p.add_argument("--ckpt", required=True, help="backbone: a .ckpt from `layerdrop pretrain` or an exported folder")
    p.add_argument("--data", required=True, metavar="DIR", help="a folder made by `layerdrop prepare`")
    p.add_argument("--out", required=True, metavar="DIR", help="where adapters.safetensors + adapters.json go")
    p.add_argument("--exits", type=_int_list, default=None,
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
    backbone = _load_backbone(parser, args.ckpt)
    exits = args.exits if args.exits is not None else default_exits(backbone.config.n_layers)
    try:
        check_exits(exits, backbone.config.n_layers)
        module = AdapterModule(backbone, exits, init=args.init, lr=args.lr, weight_decay=args.weight_decay,
                               lr_schedule=LRScheduleConfig(warmup_steps=args.warmup_steps),
                               loss_chunk_tokens=args.loss_chunk_tokens)
        trainer = _trainer(args)
    except ValueError as err:
        parser.error(str(err))
    from framework.data import TokenDataModule

    data = TokenDataModule(args.data, seq_len=args.seq_len or backbone.config.max_seq_len,
                           batch_size=args.batch_size, val_batches=args.val_batches, seed=args.seed,
                           model_vocab_size=backbone.config.vocab_size)
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
    from framework.training_progress import StepProgressBar, StepProgressLines

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


def eval_parser() -> argparse.ArgumentParser:
    p = CommandParser(prog="layerdrop adapters eval",
                                description="Per-exit validation loss with exit adapters next to plain early exit. "
                                            f"Layer numbering: {options.LAYERS}.")
    p.add_argument("--adapters", required=True, metavar="DIR", help="a folder written by `layerdrop adapters fit`")
    p.add_argument("--ckpt", default=None, help="the backbone (default: the one named in adapters.json)")
    p.add_argument("--data", required=True, metavar="DIR", help="a folder made by `layerdrop prepare`")
    p.add_argument("--seq-len", type=int, default=None, help="tokens per sequence (default and most: max_seq_len)")
    p.add_argument("--batch-size", type=int, default=8, help="sequences per batch (default 8)")
    p.add_argument("--max-tokens", type=int, default=None, help="stop after this many target tokens")
    p.add_argument("--batches", type=int, default=None, help="stop after this many batches")
    options.add_device(p)
    options.add_output(p, plot=True)
    return p


def eval_main(argv: list[str] | None = None) -> int:
    from eval.inputs import ContextLimit, ValidationData
    from framework.loop_progress import shown

    parser = eval_parser()
    args = parser.parse_args(argv)
    options.check_positive(parser, args, ("seq_len", "batch_size", "max_tokens", "batches"))
    args.plot = args.plot or str(Path(args.out).with_suffix(".png"))
    options.refuse_existing(parser, [args.out, args.plot], args.overwrite)
    device = options.resolve_device(parser, args.device)
    try:
        meta = read_meta(args.adapters)
        cfg = ModelConfig.from_dict(meta["model"])
        seq_len = ContextLimit(cfg.max_seq_len, "sequence").fit_length(args.seq_len or cfg.max_seq_len, "--seq-len")
        data = ValidationData(args.data, seq_len=seq_len, batch_size=args.batch_size, max_tokens=args.max_tokens,
                              max_batches=args.batches, model_vocab_size=cfg.vocab_size)
    except CheckpointError as err:
        parser.error(str(err))
    except (ValueError, FileNotFoundError) as err:
        parser.error(f"--data {args.data!r}: {err}")
    backbone = _load_backbone(parser, args.ckpt or meta["backbone"], device)
    try:
        adapters, _ = load_adapters(args.adapters, backbone)
    except CheckpointError as err:
        parser.error(str(err))
    passes = [shown(data, len(data), f"adapters eval: {what}, batches") for what in ("plain exits", "adapters")]
    report = {"adapters": str(args.adapters), "backbone": str(args.ckpt or meta["backbone"]),
              **evaluate(backbone, adapters, *passes), "plot": args.plot}
    write_json(args.out, report)
    _plot(report, args.plot)
    for e in report["exits"]:
        print(f"exit {e}: plain {report['plain_loss'][str(e)]:.4f}  adapter {report['adapter_loss'][str(e)]:.4f}")
    print(f"full model: {report['final_loss']:.4f}; wrote {args.out} and {args.plot}")
    return 0


def _plot(report: dict, path: str) -> None:
    from eval.plots import plot_exits

    final = {str(report["num_layers"]): report["final_loss"]}
    plot_exits([{"label": "plain early exit", "exit_loss": report["exit_loss"]},
                {"label": "with exit adapters", "exit_loss": {**report["adapter_loss"], **final}}], path)


if __name__ == "__main__":
    sys.exit(fit_main())

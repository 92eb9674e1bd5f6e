"""`layerdrop adapters eval`: per-exit validation loss with exit adapters next to plain early exit.

At every adapter exit: the cross-entropy with the adapter, and the KL to the full
model's next-token distribution with and without the adapter; beside them the plain
early-exit curve of every layer (eval/measurements/exits.py), all on the same tokens.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Iterable

import torch
import torch.nn.functional as F

from eval import options
from eval.adapters.exit_adapters import ExitAdapters, load_adapters, load_backbone, read_meta
from eval.measurements.exits import exit_losses
from framework.files.atomic_write import write_json
from framework.checkpoint import CheckpointError
from framework.command_parser import CommandParser
from framework.config import ModelConfig
from framework.model.loss import IGNORE_INDEX, chunked_sum, counted_tokens, inference_chunk_tokens
from framework.model.decoder import Decoder


@torch.inference_mode()
def adapter_losses(backbone: Decoder, adapters: ExitAdapters, batches: Iterable, *,
                   chunk_tokens: int | None = None) -> dict:
    """Token-averaged, at every adapter exit: cross-entropy with the adapter, and the KL
    to the full model with and without the adapter (plain early exit); the logits exist
    a chunk of tokens at a time (framework/model/loss.py's reducer)."""
    cfg = backbone.config
    device = backbone.embed.weight.device
    chunk_tokens = chunk_tokens or inference_chunk_tokens(cfg.vocab_size, cfg.d_model, device.type == "cuda")
    sums = {e: torch.zeros(3, dtype=torch.float64, device=device) for e in adapters.exits}
    positions = targets_counted = 0
    for inputs, targets in batches:
        inputs, targets = inputs.to(device), targets.to(device)
        out = backbone.step(inputs, exits=adapters.as_exits(), states=True)
        teacher, labels = out.hidden.flatten(0, 1), targets.flatten()
        for e, hidden in out.reads.items():
            sums[e] += chunked_sum(lambda a, p, t, y: _exit_sums(backbone.logits, a, p, t, y), hidden.flatten(0, 1),
                                   out.states[e - 1].flatten(0, 1), teacher, labels, chunk_tokens=chunk_tokens)
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
    from framework.console.loop_progress import shown

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
    backbone = load_backbone(parser, args.ckpt or meta["backbone"], device)
    try:
        adapters, _ = load_adapters(args.adapters, backbone)
    except CheckpointError as err:
        parser.error(str(err))
    passes = [shown(data, len(data), f"adapters eval: {what}, batches") for what in ("plain exits", "adapters")]
    report = {"adapters": str(args.adapters), "label": options.checkpoint_label(args.ckpt or meta["backbone"]),
              "backbone": str(args.ckpt or meta["backbone"]),
              **evaluate(backbone, adapters, *passes), "plot": args.plot}
    write_json(args.out, report)
    _plot(report, args.plot)
    for e in report["exits"]:
        print(f"exit {e}: plain {report['plain_loss'][str(e)]:.4f}  adapter {report['adapter_loss'][str(e)]:.4f}")
    print(f"{report['label']}: full model {report['final_loss']:.4f}; wrote {args.out} and {args.plot}")
    return 0


def _plot(report: dict, path: str) -> None:
    from eval.measurements.plots import plot_exits  # matplotlib takes seconds to import: only when plotting

    final = {str(report["num_layers"]): report["final_loss"]}
    plot_exits([{"label": "plain early exit", "exit_loss": report["exit_loss"]},
                {"label": "with exit adapters", "exit_loss": {**report["adapter_loss"], **final}}], path)

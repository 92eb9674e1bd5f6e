"""`layerdrop eval heldout`: validation loss on many held-out tokens, with its noise.

A comparison between two runs is only as good as the held-out sample it is made on:
with too few tokens, the difference between two models is the sample's, not theirs.
This evaluation reads the validation split (all of it by default), computes the loss at
every exit layer in one pass (``eval.measurements.exits.exit_losses``), and keeps the loss of each of
``--groups`` consecutive slices of the split. From those slices:

    standard_error[k]  = std over slices of the slice mean (token-weighted) / √G

the sampling noise of the reported loss at exit k, and, for two models evaluated on the
same slices, the standard error of their paired difference (``paired_standard_error``),
which is what decides whether a difference between runs is larger than the evaluation
noise. Consecutive slices keep a document's sequences together, so the correlation of
tokens within a document widens the estimate, as it should.

Report (the exits keys of DESIGN.md, plus the slices):
    {"num_layers", "exit_loss": {"1": …, "L": …}, "tokens", "loss" (= exit L),
     "standard_error": {"1": …}, "groups": {"tokens": [...], "exit_loss": {"1": [...], …}}}
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Iterable, Iterator, Sequence

import torch

from eval.measurements import per_source
from eval.measurements.exits import Batch, ValidationData, exit_losses
from eval.options import (add_checkpoint, add_output, add_threads, apply_threads, check_positive, checkpoint_label,
                          refuse_existing)
from framework.files.atomic_write import write_json
from framework.files.staging import is_url
from framework.checkpoint import Checkpoint, CheckpointError
from framework.command_parser import CommandParser
from framework.model.decoder import Decoder
from framework.console.loop_progress import Advancing, progress


def grouped(batches: Sequence[Batch] | Iterable[Batch], per_group: int) -> Iterator[list[Batch]]:
    """Consecutive runs of ``per_group`` batches (the last may be shorter)."""
    group: list[Batch] = []
    for batch in batches:
        group.append(batch)
        if len(group) == per_group:
            yield group
            group = []
    if group:
        yield group


def weighted_mean_and_error(values: Sequence[float], weights: Sequence[float]) -> tuple[float, float]:
    """Token-weighted mean of slice losses and its standard error (weighted std / √G)."""
    total = math.fsum(weights)
    mean = math.fsum(v * w for v, w in zip(values, weights)) / total
    count = len(values)
    if count < 2:
        return mean, float("nan")
    # Weights normalised to mean 1, so equal slices reduce to the textbook std/√G.
    norm = [w * count / total for w in weights]
    variance = math.fsum(n * n * (v - mean) ** 2 for v, n in zip(values, norm)) / (count - 1)
    return mean, math.sqrt(variance / count)


def paired_standard_error(a: dict, b: dict, exit_layer: str | None = None) -> float:
    """Standard error of loss(a) - loss(b), two heldout reports over the same slices."""
    key = exit_layer or str(a["num_layers"])
    key_b = exit_layer or str(b["num_layers"])
    tokens_a, tokens_b = a["groups"]["tokens"], b["groups"]["tokens"]
    if tokens_a != tokens_b:
        raise ValueError("the two heldout reports were not computed on the same slices of the same data "
                         f"({len(tokens_a)} vs {len(tokens_b)} slices): rerun them with the same --data, "
                         "--max-tokens, --batch-size and --groups")
    diffs = [x - y for x, y in zip(a["groups"]["exit_loss"][key], b["groups"]["exit_loss"][key_b])]
    return weighted_mean_and_error(diffs, tokens_a)[1]


@torch.inference_mode()
def heldout_losses(decoder: Decoder, batches: Iterable[Batch], *, groups: int, batches_total: int,
                   chunk_tokens: int | None = None) -> dict:
    """Exit losses over all ``batches`` and over ``groups`` consecutive slices of them."""
    per_group = max(1, math.ceil(batches_total / groups))
    slice_tokens: list[int] = []
    slice_losses: dict[str, list[float]] = {}
    num_layers = len(decoder.blocks)
    for group in grouped(batches, per_group):
        report = exit_losses(decoder, group, chunk_tokens=chunk_tokens)
        slice_tokens.append(report["tokens"])
        for k, loss in report["exit_loss"].items():
            slice_losses.setdefault(k, []).append(loss)
    if not slice_tokens:
        raise ValueError("the evaluation data yielded no tokens: check --data and --max-tokens")
    exit_loss, errors = {}, {}
    for k, losses in slice_losses.items():
        exit_loss[k], errors[k] = weighted_mean_and_error(losses, slice_tokens)
    return {"num_layers": num_layers, "exit_loss": exit_loss, "tokens": sum(slice_tokens),
            "loss": exit_loss[str(num_layers)], "standard_error": errors,
            "groups": {"tokens": slice_tokens, "exit_loss": slice_losses}}


def mixture_report(measured: dict[str, dict], asked: list) -> dict:
    """Several sources: each one's report under "sources"; at the top the mixture's loss per
    exit (Σ weight × the source's loss) with its standard error (the sources are independent
    samples: √Σ weight² × SE²). The slices stay per source."""
    weights = {source.name: source.weight for source in asked}
    first = measured[asked[0].name]
    exit_loss = {k: sum(weights[n] * r["exit_loss"][k] for n, r in measured.items()) for k in first["exit_loss"]}
    errors = {k: math.sqrt(sum((weights[n] * r["standard_error"][k]) ** 2 for n, r in measured.items()))
              for k in first["exit_loss"]}
    return {"num_layers": first["num_layers"], "exit_loss": exit_loss, "tokens": sum(r["tokens"] for r in measured.values()),
            "loss": exit_loss[str(first["num_layers"])], "standard_error": errors,
            "data_dir": [source.dir for source in asked],
            "sources": {source.name: {"dir": source.dir, "weight": source.weight, **measured[source.name]}
                        for source in asked}}


# --------------------------------------------------------------------------- CLI
def _parser() -> argparse.ArgumentParser:
    parser = CommandParser(
        prog="layerdrop eval heldout",
        description="Validation loss at every exit on many held-out tokens (default: the whole val split), "
                    "with its sampling noise from consecutive slices of the split.")
    add_checkpoint(parser)
    per_source.add_data(parser)
    parser.add_argument("--seq-len", type=int, default=None,
                        help="tokens per sequence (default: the model's max_seq_len)")
    parser.add_argument("--batch-size", type=int, default=16, help="sequences per batch (default 16)")
    parser.add_argument("--max-tokens", type=int, default=None,
                        help="at most this many target tokens, spread over the split (default: all of it)")
    parser.add_argument("--groups", type=int, default=64,
                        help="consecutive slices of the data for the standard error (default 64)")
    add_threads(parser)
    add_output(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    check_positive(parser, args, ("seq_len", "batch_size", "max_tokens", "threads"))
    if args.groups < 2:
        parser.error(f"--groups={args.groups} is invalid: the standard error needs at least 2 slices")
    refuse_existing(parser, [args.out], args.overwrite)
    asked = per_source.resolve(parser, args.data, args.mixture)
    for source in asked:
        if not is_url(source.dir) and not Path(source.dir).is_dir():
            parser.error(f"--data {source.dir!r} is not a folder: expected one made by `layerdrop prepare`")
    try:
        ckpt = Checkpoint.open(args.ckpt)  # proven harmless and read once for the command
        config = ckpt.model_config
    except (CheckpointError, FileNotFoundError) as err:
        parser.error(str(err))
    apply_threads(args.threads)
    seq_len = args.seq_len or config.max_seq_len
    data = {}
    for source in asked:
        try:
            data[source.name] = ValidationData(source.dir, seq_len=seq_len, batch_size=args.batch_size,
                                               max_tokens=args.max_tokens, max_batches=None,
                                               model_vocab_size=config.vocab_size)
        except (ValueError, FileNotFoundError) as err:
            parser.error(f"--data {source.dir!r}: {err}")
    try:
        decoder, _ = ckpt.load_decoder()
    except CheckpointError as err:  # NaN weights, a damaged weights file
        parser.error(str(err))
    with progress(sum(map(len, data.values())), "eval heldout: batches") as bar:
        measured = {name: heldout_losses(decoder, Advancing(batches, bar), groups=args.groups,
                                         batches_total=len(batches.loader)) for name, batches in data.items()}
    if len(asked) == 1 and args.mixture is None:
        report = {**measured[asked[0].name], "data_dir": asked[0].dir}
    else:
        report = mixture_report(measured, asked)
    report.update(label=checkpoint_label(args.ckpt), ckpt=str(args.ckpt), seq_len=seq_len, batch_size=args.batch_size)
    write_json(args.out, report)
    final = str(report["num_layers"])
    for name, part in [("", report), *[(f" · {n}", r) for n, r in report.get("sources", {}).items()]]:
        slices = f", {len(part['groups']['tokens'])} slices" if "groups" in part else ""
        print(f"{report['label']}{name}: held-out loss {part['loss']:.4f} ± {part['standard_error'][final]:.4f} "
              f"(standard error{slices}) on {part['tokens']:,} tokens")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

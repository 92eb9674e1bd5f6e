"""Early-exit and layer-skip validation losses: `layerdrop eval exits` / `eval skip`.

Early exit at layer k runs blocks 0..k-1, then the final norm and unembedding (paper
§8.1.1). All L exits come from ONE pass over the data: the blocks run once, and the
residual stream after every block goes through the shared norm + head. The head is the
expensive part with a big vocabulary (128,256 × d per token), so it runs a chunk of
tokens at a time and only the summed cross-entropy survives each chunk.

Layer skipping removes a set of blocks (the residual passes through). A set's forward
equals the full model's up to its first skipped block, so each batch runs the full
model once, keeping every block's output, and each set resumes from the state just
before its first skipped block.

Reports (keys fixed in DESIGN.md; one checkpoint -> these keys at the top level,
several -> the first model's keys at the top level and every model under "models"):
    exits: {"num_layers": L, "exit_loss": {"1": …, "L": …}, "tokens": n}
    skip:  {"results": [{"skip_layers": [...], "loss": …, "params_kept": …}, ...]}
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from pathlib import Path
from typing import Iterable, Sequence

import torch

from framework.files.atomic_write import write_json
from framework.files.staging import is_url
from eval import options
from eval import skip_sets as sets
from eval.measurements import per_source
from eval.inputs import Batch, ContextLimit, ValidationData
from framework.checkpoint import Checkpoint, CheckpointError
from framework.command_parser import CommandParser
from framework.model.loss import counted_tokens, inference_chunk_tokens, summed_cross_entropy
from framework.model.decoder import Decoder
from framework.console.loop_progress import Advancing, progress

# `eval skip` without --sets/--sweep: the full model, the paper's "skip alternate layers"
# (the odd ones, which ALD trains to be skippable) and the middle-out loss-vs-memory curve.
DEFAULT_SETS = ("none", "alternate-odd")
DEFAULT_SWEEPS = ("middle",)


# --------------------------------------------------------------------------- losses
def default_chunk_tokens(decoder: Decoder) -> int:
    cfg = decoder.config
    return inference_chunk_tokens(cfg.vocab_size, cfg.d_model, decoder.embed.weight.is_cuda)


def _summed_loss(decoder: Decoder, hidden: torch.Tensor, targets: torch.Tensor, chunk_tokens: int) -> torch.Tensor:
    return summed_cross_entropy(hidden, targets, decoder.logits, chunk_tokens=chunk_tokens)


@torch.inference_mode()
def exit_losses(decoder: Decoder, batches: Iterable[Batch], *, chunk_tokens: int | None = None,
                exits: Sequence[int] | None = None) -> dict:
    """Mean validation loss at every exit layer 1..L (or only at ``exits``), from one
    pass over ``batches``; the blocks run up to the deepest exit asked for."""
    chunk_tokens = chunk_tokens or default_chunk_tokens(decoder)
    device = decoder.embed.weight.device
    num_layers = len(decoder.blocks)
    exits = sorted(set(range(1, num_layers + 1) if exits is None else exits))
    for k in exits:
        decoder.active_layers(k)  # validates 1..L before any work
    sums = torch.zeros(len(exits), dtype=torch.float64, device=device)
    tokens = 0
    for inputs, targets in batches:
        states = decoder.step(inputs.to(device), layers=range(exits[-1]), states=True).states
        for index, k in enumerate(exits):
            sums[index] += _summed_loss(decoder, states[k - 1], targets, chunk_tokens)
        tokens += counted_tokens(targets)
    _require_tokens(tokens)
    return {"num_layers": num_layers,
            "exit_loss": {str(k): float(sums[i] / tokens) for i, k in enumerate(exits)},
            "tokens": tokens}


@torch.inference_mode()
def skip_losses(decoder: Decoder, batches: Iterable[Batch], skips: Sequence[Sequence[int]], *,
                chunk_tokens: int | None = None) -> dict:
    """Mean validation loss of the model with each skip set removed, one pass over the data."""
    chunk_tokens = chunk_tokens or default_chunk_tokens(decoder)
    device = decoder.embed.weight.device
    num_layers = len(decoder.blocks)
    skips = [tuple(sorted(s)) for s in skips]
    for skip in skips:
        decoder.active_layers(None, skip)  # validates before any work
    sums = torch.zeros(len(skips), dtype=torch.float64, device=device)
    tokens = 0
    for inputs, targets in batches:
        # a skip set is the full model up to its first skipped block: resume from there
        embedded = decoder.step(inputs.to(device), layers=[]).hidden
        prefix = [embedded] + decoder.step(embedded, states=True).states
        for index, skip in enumerate(skips):
            first = skip[0] if skip else num_layers
            rest = [i for i in range(first, num_layers) if i not in skip]
            final = decoder.step(prefix[first], layers=rest).hidden
            sums[index] += _summed_loss(decoder, final, targets, chunk_tokens)
        tokens += counted_tokens(targets)
    _require_tokens(tokens)
    results = [{"skip_layers": list(skip), "loss": float(sums[i] / tokens),
                "params_kept": sets.params_kept(decoder, skip),
                "layers_kept": num_layers - len(skip),
                "name": sets.describe(skip, num_layers)} for i, skip in enumerate(skips)]
    return {"num_layers": num_layers, "params_total": decoder.num_parameters(),
            "results": sets.order_by_params_kept(results), "tokens": tokens}


def _require_tokens(tokens: int) -> None:
    if tokens == 0:
        raise ValueError("the evaluation data yielded no tokens: check --data, --batches and --max-tokens")


# --------------------------------------------------------------------------- CLI
def _common_parser(prog: str, description: str) -> argparse.ArgumentParser:
    parser = CommandParser(prog=prog, description=f"{description} Layer numbering: {options.LAYERS}.")
    options.add_checkpoint(parser, several=True)
    parser.add_argument("--label", nargs="+", action="extend", default=None, metavar="NAME",
                        help="plot/report label per checkpoint (default: the run's name, runs/x/checkpoints/"
                             "last.ckpt -> x)")
    per_source.add_data(parser)
    parser.add_argument("--seq-len", type=int, default=None,
                        help="tokens per sequence (default and most: the models' max_seq_len)")
    parser.add_argument("--batch-size", type=int, default=8, help="sequences per batch (default 8)")
    parser.add_argument("--max-tokens", type=int, default=None,
                        help="stop after this many target tokens (default: the whole split)")
    parser.add_argument("--batches", type=int, default=None, help="stop after this many batches")
    parser.add_argument("--chunk-tokens", type=int, default=None,
                        help="tokens per unembedding chunk (default: 2^26/vocab on GPU; "
                             "max(d_model, 2^21/vocab) on CPU)")
    options.add_device(parser)
    options.add_output(parser, plot=True)
    return parser


def _check_common(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    options.check_positive(parser, args, ("seq_len", "batch_size", "max_tokens", "batches", "chunk_tokens"))
    args.labels = args.label or default_labels(args.ckpt)
    if len(args.labels) != len(args.ckpt):
        parser.error(f"--label has {len(args.labels)} names for {len(args.ckpt)} checkpoints: give one per --ckpt")
    if len(set(args.labels)) != len(args.labels):
        parser.error(f"--label {args.labels} is invalid: labels must be distinct")
    args.plot = args.plot or str(Path(args.out).with_suffix(".png"))
    options.refuse_existing(parser, [args.out, args.plot], args.overwrite)
    args.sources = per_source.resolve(parser, args.data, args.mixture)
    for source in args.sources:
        if not is_url(source.dir) and not Path(source.dir).is_dir():  # URLs are litdata's to check
            parser.error(f"--data {source.dir!r} is not a folder: expected one made by `layerdrop prepare`")
    for path in args.ckpt:
        if not Path(path).exists():
            parser.error(f"checkpoint {path!r} does not exist")
    try:  # each checkpoint opened (proven harmless, metadata read) once for the command
        args.checkpoints = [Checkpoint.open(p) for p in args.ckpt]
        args.configs = [ckpt.model_config for ckpt in args.checkpoints]
    except (CheckpointError, FileNotFoundError) as err:
        parser.error(str(err))
    args.device = options.resolve_device(parser, args.device)
    window = min(c.max_seq_len for c in args.configs)
    args.seq_len = ContextLimit(window, "sequence").fit_length(args.seq_len or args.configs[0].max_seq_len,
                                                              "--seq-len")


def default_labels(paths: Sequence[str]) -> list[str]:
    """Each checkpoint's name as every command gives it (eval/options.py)."""
    return options.checkpoint_labels(paths)


def _read_data(parser: argparse.ArgumentParser, args: argparse.Namespace) -> dict[str, ValidationData]:
    """Each source's validation batches, by source name (every folder read before any model loads)."""
    data = {}
    for source in args.sources:
        try:
            data[source.name] = ValidationData(source.dir, seq_len=args.seq_len, batch_size=args.batch_size,
                                               max_tokens=args.max_tokens, max_batches=args.batches,
                                               model_vocab_size=min(c.vocab_size for c in args.configs))
        except (ValueError, FileNotFoundError) as err:
            parser.error(f"--data {source.dir!r}: {err}")
    return data


def _combined(reports: list[dict]) -> dict:
    if len(reports) == 1:
        return reports[0]
    return {**reports[0], "models": reports}


def _evaluate_each(parser: argparse.ArgumentParser, args: argparse.Namespace, data: dict[str, ValidationData],
                   evaluate, what: str, kind: str) -> list[dict]:
    """``evaluate(index, decoder, batches)`` for every checkpoint (its index) on every source, with one progress
    display; a checkpoint whose weights cannot be loaded (NaN, a damaged file) stops in one line."""
    reports = []
    with progress(sum(map(len, data.values())) * len(args.ckpt), f"{what}: batches") as bar:
        for index, (path, ckpt, label) in enumerate(zip(args.ckpt, args.checkpoints, args.labels)):
            try:
                decoder, _ = ckpt.load_decoder(args.device)
            except CheckpointError as err:
                parser.error(str(err))
            measured = {name: evaluate(index, decoder, Advancing(batches, bar)) for name, batches in data.items()}
            single = len(args.sources) == 1 and args.mixture is None
            report = measured[args.sources[0].name] if single else per_source.combine(measured, args.sources, kind)
            reports.append({"label": label, "ckpt": str(path), **report,
                            "ln_vocab": math.log(decoder.config.vocab_size)})  # the uniform guess, for the plot
            del decoder
    return reports


def _data_fields(args: argparse.Namespace) -> dict:
    """Where the report's numbers come from: the folder, or every source and its weight."""
    if len(args.sources) == 1 and args.mixture is None:
        return {"data_dir": args.sources[0].dir}
    return {"data_dir": [source.dir for source in args.sources],
            "mixture": {source.name: {"dir": source.dir, "weight": source.weight} for source in args.sources}}


def parse_exit_layers(spec: str, num_layers: int) -> list[int]:
    """"4,8,12" or "2-6" (or both, comma separated) -> sorted exits, each in 1..L."""
    exits: set[int] = set()
    for part in (p.strip() for p in spec.split(",")):
        match = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if not match:
            raise ValueError(f"exit layers {spec!r} are invalid: give exits in 1..{num_layers} like 2,4 or 2-6")
        start, end = int(match.group(1)), int(match.group(2) or match.group(1))
        exits.update(range(start, end + 1))
    bad = sorted(k for k in exits if not 1 <= k <= num_layers)
    if bad or not exits:
        raise ValueError(f"exit layers {spec!r} are invalid: {bad} outside 1..{num_layers} "
                         f"(the model has {num_layers} layers)")
    return sorted(exits)


def _exit_layers(parser: argparse.ArgumentParser, spec: str | None, num_layers: int) -> list[int] | None:
    if spec is None:
        return None
    try:
        return parse_exit_layers(spec, num_layers)
    except ValueError as err:
        parser.error(str(err))


def exits_main(argv: list[str] | None = None) -> int:
    parser = _common_parser("layerdrop eval exits",
                            "Validation loss at every early-exit layer 1..L, in one pass over the data.")
    parser.add_argument("--exit-layers", default=None, metavar="SPEC",
                        help="only these exits, e.g. 4,8,12 or 2-6 (default: all, 1..L); each costs one "
                             "head + cross-entropy over the data")
    args = parser.parse_args(argv)
    _check_common(parser, args)
    exits = [_exit_layers(parser, args.exit_layers, cfg.n_layers) for cfg in args.configs]
    data = _read_data(parser, args)
    reports = _evaluate_each(parser, args, data, lambda i, d, b: exit_losses(d, b, chunk_tokens=args.chunk_tokens,
                                                                         exits=exits[i]), "eval exits", "exits")
    report = _combined(reports)
    report.update(**_data_fields(args), seq_len=args.seq_len, plot=args.plot)
    from eval.measurements.plots import exits_figure, plot_exits, save_figure

    if "sources" in reports[0]:
        args.source_plot = str(Path(args.plot).with_name(Path(args.plot).stem + "-sources.png"))
        report["source_plot"] = args.source_plot
        series, colour_of = per_source.per_source_series(reports)
        save_figure(exits_figure(series, title="Early exit per source", colour_of=colour_of), args.source_plot)
    write_json(args.out, report)
    plot_exits(reports, args.plot)
    for r in reports:
        for name, part in [("", r), *[(f" · {n}", s) for n, s in r.get("sources", {}).items()]]:
            losses = "  ".join(f"{k}:{v:.4f}" for k, v in part["exit_loss"].items())
            print(f"{r['label']}{name}: exit loss ({part['tokens']} tokens)  {losses}")
    print(f"wrote {args.out} and {args.plot}" + (f" and {report['source_plot']}" if "source_plot" in report else ""))
    return 0


def skip_main(argv: list[str] | None = None) -> int:
    parser = _common_parser("layerdrop eval skip",
                            "Validation loss vs parameters kept when skipping sets of layers.")
    parser.add_argument("--sets", nargs="+", action="extend", default=None, metavar="SPEC",
                        help="skip sets: none, alternate-odd, alternate-even, a range a-b, or a list "
                             "i,j,k (default: none alternate-odd, plus --sweep middle)")
    parser.add_argument("--sweep", nargs="+", action="extend", default=None, choices=sets.SWEEPS,
                        help="families of sets: alternate, single, middle (k middle layers, k=1..L-2), "
                             "contiguous (every range)")
    args = parser.parse_args(argv)
    _check_common(parser, args)
    if args.sets is None and args.sweep is None:
        args.sets, args.sweep = list(DEFAULT_SETS), list(DEFAULT_SWEEPS)
    elif args.sweep:  # a sweep is read against the full model: its row leads the table and the plot
        args.sets = ["none", *(args.sets or [])]
    try:
        skips = [sets.resolve_sets(args.sets or [], args.sweep or [], cfg.n_layers) for cfg in args.configs]
    except ValueError as err:
        parser.error(str(err))
    data = _read_data(parser, args)
    reports = _evaluate_each(parser, args, data, lambda i, d, b: skip_losses(d, b, skips[i],
                                                                         chunk_tokens=args.chunk_tokens),
                             "eval skip", "skip")
    report = _combined(reports)
    report.update(**_data_fields(args), seq_len=args.seq_len, plot=args.plot)
    write_json(args.out, report)
    from eval.measurements.plots import plot_skip

    plot_skip(reports, args.plot)
    for r in reports:
        print(f"{r['label']}: {len(r['results'])} skip sets ({r['tokens']} tokens)")
        for row in r["results"]:
            print(f"  {row['name']:>16}  params kept {row['params_kept']:>12,}  loss {row['loss']:.4f}")
    print(f"wrote {args.out} and {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(exits_main())

"""`layerdrop eval dynamic`: what a confidence threshold of dynamic early exit costs.

For each threshold, the quantities a user needs to pick one:

- ``layers_per_token``: blocks a generated token runs on average (greedy decoding of
  the prompts, with ``eval.decoding.dynamic_exit.DynamicExit``);
- ``agreement``: the share of positions where that decoding writes the same token as
  full-model greedy decoding of the same prompts, and ``prefix_agreement``, the share
  written before the first difference (every later token has another context);
- ``loss``: the validation cross-entropy of the tokens as dynamic exit decodes them:
  every position of the validation text takes the exit its own confidence picks,
  attending to the propagated K/V of the positions before it (``dynamic_forward``,
  teacher-forced), with ``loss_layers_per_token`` its average exit;
- ``tokens_per_s``: of that decoding, next to full decoding's in the report.

Threshold 1 is the full model (agreement 1, the full model's loss); 0 exits every
token at the first candidate. The JSON report comes with a PNG of agreement and loss
against layers per token.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

import torch

from framework.files.atomic_write import write_json
from eval import options
from eval.decoding.batch import BatchGenerator, generate_in_batches
from eval.decoding.dynamic_exit import DynamicExit, check_threshold, dynamic_forward, parse_candidates
from eval.decoding.static_route import StaticRoute
from framework.command_parser import CommandParser
from framework.model.loss import counted_tokens, inference_chunk_tokens, summed_cross_entropy
from framework.model.decoder import Decoder

# Wide on purpose: a briefly trained model is rarely confident (the demo model's margins
# are mostly under 0.3), a well-trained one often is.
DEFAULT_THRESHOLDS = (0.0, 0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 0.9, 1.0)


@torch.inference_mode()
def dynamic_loss(model: Decoder, route: DynamicExit, batches) -> dict:
    """Validation loss and mean exit of the tokens as dynamic exit decodes them."""
    cfg = model.config
    device = model.embed.weight.device
    chunk = inference_chunk_tokens(cfg.vocab_size, cfg.d_model, device.type == "cuda")
    total = torch.zeros((), dtype=torch.float64, device=device)
    exits = positions = tokens = 0
    for inputs, targets in batches:
        inputs, targets = inputs.to(device), targets.to(device)
        hidden, chosen = dynamic_forward(model, route, inputs)
        total += summed_cross_entropy(hidden, targets, model.logits, chunk_tokens=chunk)
        exits += int(chosen.sum())
        positions += chosen.numel()
        tokens += counted_tokens(targets)
    if tokens == 0:
        raise ValueError("the evaluation data yielded no tokens: check --data and --batches")
    return {"loss": float(total) / tokens, "loss_layers_per_token": exits / positions}


def agreement(reference: Sequence[Sequence[int]], outputs: Sequence[Sequence[int]]) -> tuple[float, float]:
    """(same token at the same position, share before the first difference), over all positions."""
    same = before = total = 0
    for ref, out in zip(reference, outputs):
        width = max(len(ref), len(out))
        matches = [a == b for a, b in zip(ref, out)]
        same += sum(matches)
        before += next((i for i, m in enumerate(matches) if not m), len(matches))
        total += width
    return (same / total, before / total) if total else (1.0, 1.0)


def curve(model: Decoder, prompts: Sequence[Sequence[int]], batches, *, thresholds: Sequence[float],
          exits: Sequence[int] | None = None, adapters=None, max_new_tokens: int = 32, batch_size: int = 8,
          on_step=None) -> dict:
    """The report: one row per threshold (see the module docstring)."""
    full, full_stats = generate_in_batches(BatchGenerator(model, StaticRoute(model)).generate, prompts, batch_size,
                                           max_new_tokens=max_new_tokens)
    reference = [item.tokens for item in full]
    rows = []
    for threshold in thresholds:
        route = DynamicExit(model, threshold=check_threshold(threshold), exits=exits, adapters=adapters)
        items, stats = generate_in_batches(BatchGenerator(model, route).generate, prompts, batch_size,
                                           max_new_tokens=max_new_tokens)
        same, prefix = agreement(reference, [item.tokens for item in items])
        summary = stats.summary()
        rows.append({"threshold": threshold, "layers_per_token": summary["layers_per_token"], "agreement": same,
                     "prefix_agreement": prefix, "tokens_per_s": summary["tokens_per_s"],
                     **dynamic_loss(model, route, batches)})
        if on_step is not None:
            on_step()
    probe = DynamicExit(model, threshold=1.0, exits=exits, adapters=adapters)
    return {"num_layers": len(model.blocks), "candidates": probe.candidates, "adapters": adapters is not None,
            "prompts": len(prompts), "max_new_tokens": max_new_tokens,
            "full": {"tokens_per_s": full_stats.summary()["tokens_per_s"]}, "thresholds": rows}


def plot_curve(report: dict, path: str | Path, label: str | None = None) -> Path:
    """Agreement with full greedy and validation loss vs blocks per token, one point a threshold."""
    from eval.measurements.plots import save_figure  # the project's file writing

    return save_figure(curve_figure(report, label), path)


def threshold_groups(rows: list[dict]) -> list[tuple[float, float, str]]:
    """(x, y, text) of the threshold labels: thresholds that land on one point share a
    label, so a curve whose thresholds coincide gets one label there, not a pile. Three or
    more thresholds in a row (of all the curve's) read as a range: "τ 0.05–0.9 (7)"."""
    order = sorted(r["threshold"] for r in rows)
    groups: dict[tuple[float, float], list[float]] = {}
    for r in rows:
        groups.setdefault((round(r["layers_per_token"], 2), round(r["agreement"], 3)), []).append(r["threshold"])

    def text(taus: list[float]) -> str:
        taus = sorted(taus)
        first = order.index(taus[0])
        if len(taus) >= 3 and order[first:first + len(taus)] == taus:
            return f"τ {taus[0]:g}–{taus[-1]:g} ({len(taus)})"
        return "τ " + ", ".join(f"{t:g}" for t in taus)

    return [(x, y, text(taus)) for (x, y), taus in sorted(groups.items())]


def curve_figure(report: dict, label: str | None = None):
    """The figure of ``plot_curve``: top, agreement; bottom, the loss as decoded; both
    against the blocks a token runs, with full decoding (L blocks, τ = 1) marked."""
    from eval.measurements.plots import plt  # the project's matplotlib setup (Agg)

    rows = sorted(report["thresholds"], key=lambda r: r["layers_per_token"])
    layers = [r["layers_per_token"] for r in rows]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(6.8, 6.4), sharex=True)
    top.plot(layers, [r["agreement"] for r in rows], marker="o", label="same token as full greedy, per position")
    top.plot(layers, [r["prefix_agreement"] for r in rows], marker="s", label="tokens before the first difference")
    right = max(layers)
    for index, (x, y, text) in enumerate(threshold_groups(rows)):
        side = -4 if x == right else 4  # the rightmost label runs leftwards, inside the axes
        top.annotate(text, (x, y), fontsize=7, textcoords="offset points", ha="right" if side < 0 else "left",
                     xytext=(side, 5) if index % 2 == 0 else (side, -11))  # alternate: neighbours stay apart
    full_layers = report["num_layers"]
    for ax in (top, bottom):
        ax.axvline(full_layers, color="grey", linestyle=":", linewidth=1)
        ax.grid(alpha=0.3)
    top.plot([], [], color="grey", linestyle=":", linewidth=1, label=f"full decoding: {full_layers} blocks per token")
    top.set_ylabel("agreement with full greedy (share)")
    top.set_ylim(-0.05, 1.1)
    top.set_title(f"Dynamic early exit{f' of {label}' if label else ''}: one point per confidence threshold τ",
                  fontsize=10)
    top.legend(fontsize=7, loc="lower right")
    bottom.plot(layers, [r["loss"] for r in rows], marker="o", color="tab:red", label="loss as dynamic exit decodes")
    full = next((r["loss"] for r in rows if r["threshold"] >= 1), None)
    if full is not None:
        bottom.axhline(full, color="grey", linestyle="--", linewidth=1, label="full decoding (τ = 1)")
    bottom.legend(fontsize=7)
    adapters = "; an adapter block counts one" if report.get("adapters") else ""
    bottom.set_xlabel(f"blocks run per token (full decoding: {full_layers}{adapters})")
    bottom.set_ylabel("validation loss (nats/token)")
    return fig


# -------------------------------------------------------------------------- CLI
def _parser() -> argparse.ArgumentParser:
    p = CommandParser(prog="layerdrop eval dynamic",
                                description="Dynamic early exit at several confidence thresholds: agreement with "
                                            "full greedy decoding and validation loss vs layers per token. "
                                            f"Layer numbering: {options.LAYERS}.")
    options.add_checkpoint(p)
    p.add_argument("--data", required=True, metavar="DIR",
                   help="a folder made by `layerdrop prepare`: prompts and loss from its validation split")
    p.add_argument("--thresholds", default=",".join(f"{t:g}" for t in DEFAULT_THRESHOLDS), metavar="T,T",
                   help="confidence thresholds in [0, 1] (default: 0,0.05,0.1,0.2,0.3,0.5,0.7,0.9,1)")
    p.add_argument("--exits", default=None, metavar="K,K",
                   help="candidate exits, each in 1..L-1 (default: ~L/4, L/2, 3L/4, or the adapters')")
    options.add_adapters(p, "candidate exits read through them")
    p.add_argument("--num-prompts", type=int, default=16, help="prompts to decode (default 16)")
    p.add_argument("--prompt-len", type=int, default=32, help="prompt tokens (default 32)")
    options.add_max_new_tokens(p, default=32)
    p.add_argument("--batch-size", type=int, default=8, help="prompts decoded together, sequences per loss batch")
    p.add_argument("--batches", type=int, default=4, help="validation batches of the loss (default 4)")
    p.add_argument("--seq-len", type=int, default=None, help="tokens per loss sequence (default: max_seq_len)")
    options.add_device(p)
    options.add_threads(p)
    options.add_output(p, plot=True)
    return p


def _thresholds(text: str) -> list[float]:
    try:
        values = [float(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise ValueError(f"--thresholds {text!r} is invalid: give numbers in [0, 1] like 0.5,0.9,1") from None
    if not values:
        raise ValueError(f"--thresholds {text!r} is invalid: give numbers in [0, 1] like 0.5,0.9,1")
    return [check_threshold(v) for v in values]


def main(argv: list[str] | None = None) -> int:
    from eval.inputs import ContextLimit, ValidationData, validation_prompts
    from framework.checkpoint import Checkpoint, CheckpointError
    from framework.console.loop_progress import progress

    parser = _parser()
    args = parser.parse_args(argv)
    options.check_positive(parser, args, ("num_prompts", "prompt_len", "max_new_tokens", "batch_size", "batches",
                                          "seq_len", "threads"))
    args.plot = args.plot or str(Path(args.out).with_suffix(".png"))
    options.refuse_existing(parser, [args.out, args.plot], args.overwrite)
    options.check_checkpoint(parser, args.ckpt)
    device = options.resolve_device(parser, args.device)
    options.apply_threads(args.threads)
    try:
        thresholds = _thresholds(args.thresholds)
        ckpt = Checkpoint.open(args.ckpt)  # proven harmless and read once for the whole command
        cfg = ckpt.model_config
        exits = parse_candidates(args.exits, cfg.n_layers) if args.exits else None
        args.max_new_tokens = options.max_new_tokens(args, cfg.max_seq_len)
        seq_len = ContextLimit(cfg.max_seq_len, "sequence").fit_length(args.seq_len or cfg.max_seq_len, "--seq-len")
        prompt_len = ContextLimit(cfg.max_seq_len - args.max_new_tokens, "prompt").fit_length(args.prompt_len,
                                                                                            "--prompt-len")
        data = ValidationData(args.data, seq_len=seq_len, batch_size=args.batch_size, max_tokens=None,
                              max_batches=args.batches, model_vocab_size=cfg.vocab_size)
        prompts = validation_prompts(args.data, count=args.num_prompts, length=prompt_len,
                                     model_vocab_size=cfg.vocab_size)
        model, cfg = ckpt.load_decoder(device)
        adapters = None
        if args.adapters is not None:
            from eval.adapters.exit_adapters import load_adapters

            adapters = load_adapters(args.adapters, model)[0]
        DynamicExit(model, threshold=1.0, exits=exits, adapters=adapters)  # checks the candidates
    except (CheckpointError, FileNotFoundError, ValueError) as err:
        parser.error(str(err))
    with progress(len(thresholds), "eval dynamic: thresholds") as bar:
        report = curve(model, prompts, list(data), thresholds=thresholds, exits=exits, adapters=adapters,
                       max_new_tokens=args.max_new_tokens, batch_size=args.batch_size, on_step=bar.advance)
    label = options.checkpoint_label(args.ckpt)
    report.update(label=label, ckpt=str(args.ckpt), data_dir=str(args.data), seq_len=seq_len, prompt_len=prompt_len,
                  plot=args.plot)
    write_json(args.out, report)
    plot_curve(report, args.plot, label)
    for r in report["thresholds"]:
        print(f"{label}: threshold {r['threshold']:<5g} blocks/token {r['layers_per_token']:.2f}  agreement "
              f"{r['agreement']:.1%}  loss {r['loss']:.4f}  {r['tokens_per_s']:.0f} tokens/s")
    print(f"wrote {args.out} and {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

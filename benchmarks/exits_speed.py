"""What does the loss at EVERY early exit cost, next to one ordinary evaluation forward?

Three ways to evaluate the same batch with the same decoder (inference mode):

  (a) plain:     one forward + cross-entropy (the validation loss of the full model);
  (b) one pass:  eval/measurements/exits.exit_losses: the blocks once, then the final norm + head +
                 cross-entropy on the residual stream after each of the L blocks;
  (c) L passes:  a forward with exit_layer=k + cross-entropy, for k = 1..L (the naive way).

Goal: (b)/(a) <= 1.5. What bounds it: (b) runs the head L times, so with FLOPs
F_blocks + F_head for (a), (b) costs F_blocks + L·F_head; the ratio is near 1 only when
the head is a small share of the forward. The report gives that FLOP prediction next to
each measurement, and for the paper's sizes (Table A.1, vocab 128,256, S = 2048).

Repetitions are interleaved and rotated so load on the machine hits the variants
alike; medians of wall and process-CPU time are reported.

    .venv/bin/python benchmarks/exits_speed.py
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

# Before torch starts OpenMP: spinning threads stall each other when jobs share cores
# (see benchmarks/layer_dropout_speed.py).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from harness import RESULTS as RESULTS_DIR, environment, timed, write_results  # noqa: E402  (first: the repository's packages)
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from eval.measurements.exits import exit_losses  # noqa: E402
from framework.config import PAPER_SIZES, ModelConfig  # noqa: E402
from framework.flops import dense_step_flops  # noqa: E402
from framework.model.decoder import Decoder  # noqa: E402

RESULTS = RESULTS_DIR / "exits_speed.json"
VARIANTS = ("plain", "one_pass", "l_passes")
# name -> (d_model, n_layers, n_heads, vocab_size): the tiny recipe's model, a deeper
# one (the head's share halves), and a bigger vocabulary (the head's share grows).
SHAPES = {
    "tiny recipe (d256 L6 V8192)": (256, 6, 4, 8192),
    "deeper (d256 L12 V8192)": (256, 12, 4, 8192),
    "big vocab (d256 L6 V32768)": (256, 6, 4, 32768),
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seq-len", type=int, default=128, help="the tiny recipe's")
    parser.add_argument("--batch-size", type=int, default=8, help="the tiny recipe's")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--reps", type=int, default=5, help="timed rounds per shape")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS)
    return parser.parse_args(argv)


def predicted_ratio(cfg: ModelConfig, batch_size: int, seq_len: int) -> float:
    """(F_blocks + L·F_head) / (F_blocks + F_head), forward only, all S keys (SDPA)."""
    flops = dense_step_flops(cfg, batch_size, seq_len, causal=False, training=False)
    return (flops.blocks + cfg.n_layers * flops.head) / flops.total


def run_variant(variant: str, decoder: Decoder, inputs: torch.Tensor, targets: torch.Tensor) -> None:
    with torch.inference_mode():
        if variant == "plain":
            F.cross_entropy(decoder(inputs).flatten(0, 1), targets.flatten())
        elif variant == "one_pass":
            exit_losses(decoder, [(inputs, targets)])
        else:
            for k in range(1, len(decoder.blocks) + 1):
                F.cross_entropy(decoder(inputs, exit_layer=k).flatten(0, 1), targets.flatten())


def measure(shape: tuple[int, int, int, int], args: argparse.Namespace) -> dict:
    d, n_layers, heads, vocab = shape
    torch.manual_seed(args.seed)
    cfg = ModelConfig(vocab_size=vocab, d_model=d, n_layers=n_layers, n_heads=heads, max_seq_len=args.seq_len,
                      attention="sdpa")
    decoder = Decoder(cfg).eval()
    tokens = torch.randint(0, vocab, (args.batch_size, args.seq_len + 1))
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    for variant in VARIANTS:  # warm-up
        run_variant(variant, decoder, inputs, targets)
    samples: dict[str, list[tuple[float, float]]] = {v: [] for v in VARIANTS}
    for rep in range(args.reps):
        for variant in VARIANTS[rep % 3:] + VARIANTS[:rep % 3]:
            samples[variant].append(timed(lambda: run_variant(variant, decoder, inputs, targets))[1:])
    wall = {v: statistics.median(t[0] for t in s) for v, s in samples.items()}
    cpu = {v: statistics.median(t[1] for t in s) for v, s in samples.items()}
    flops = dense_step_flops(cfg, args.batch_size, args.seq_len, causal=False, training=False)
    return {"d_model": d, "n_layers": n_layers, "vocab_size": vocab, "head_flop_share": flops.head / flops.total,
            "predicted_one_pass_over_plain": predicted_ratio(cfg, args.batch_size, args.seq_len),
            "median_wall_s": wall, "median_cpu_s": cpu,
            "one_pass_over_plain_wall": wall["one_pass"] / wall["plain"],
            "one_pass_over_plain_cpu": cpu["one_pass"] / cpu["plain"],
            "l_passes_over_plain_wall": wall["l_passes"] / wall["plain"],
            "l_passes_over_one_pass_wall": wall["l_passes"] / wall["one_pass"]}


def paper_predictions(seq_len: int = 2048) -> dict[str, float]:
    return {name: predicted_ratio(ModelConfig.paper(name, max_seq_len=seq_len), 1, seq_len) for name in PAPER_SIZES}


def markdown(result: dict) -> str:
    rows = ["| model | head share of forward FLOPs | one pass / plain (wall) | (CPU) | FLOP prediction "
            "| L passes / plain (wall) |", "|---|---|---|---|---|---|"]
    for name, r in result["shapes"].items():
        rows.append(f"| {name} | {r['head_flop_share']:.0%} | {r['one_pass_over_plain_wall']:.2f}x "
                    f"| {r['one_pass_over_plain_cpu']:.2f}x | {r['predicted_one_pass_over_plain']:.2f}x "
                    f"| {r['l_passes_over_plain_wall']:.2f}x |")
    paper = ", ".join(f"{k} {v:.1f}x" for k, v in result["paper_sizes_predicted"].items())
    return "\n".join(rows) + f"\n\nFLOP prediction at the paper's sizes (V=128,256, S=2048): {paper}"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()[0]
    start = time.perf_counter()
    result = {"config": {"seq_len": args.seq_len, "batch_size": args.batch_size, "reps": args.reps,
                         "threads": args.threads},
              "shapes": {name: measure(shape, args) for name, shape in SHAPES.items()},
              "paper_sizes_predicted": paper_predictions(),
              "elapsed_s": None}
    result["elapsed_s"] = round(time.perf_counter() - start, 1)
    result["environment"] = environment(load_avg_1min=[load_before, os.getloadavg()[0]])
    write_results(args.out, result)
    print(markdown(result))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Decoding tokens/s at a paper shape, for benchmarks/gpu_check.sh: greedy, batch 1 and 8, the full
model and an early exit at L/3 (what an exit draft costs a token), eager and compiled.

Random weights (a speed figure needs no trained model: every token runs the same blocks), the
prompts random ids of ``--prompt-len`` tokens, ``--new-tokens`` new ones each (no EOS), one
untimed warm-up then ``--repeats`` timed runs, medians; on CUDA every timed run ends with a
synchronize. ``--compile`` adds each case through compiled steps (eval/decoding/compiled_step.py,
`generate --compile`'s path), once per ``--shapes`` (static: a fixed-size cache, CUDA graphs on
a GPU; dynamic: the growing cache): its warm-up run compiles (the time it took is recorded), and
the timed runs must give the eager run's tokens. The JSON is rewritten after every row, so a
run stopped by a timeout keeps the rows it finished.

    python benchmarks/gpu_decoding.py --shape 504M --device cuda --dtype bfloat16 --out DIR
    python benchmarks/gpu_decoding.py --shape tiny --device cpu --new-tokens 8 --repeats 1 --out DIR   # smoke
    python benchmarks/gpu_decoding.py --shape cpu-base --device cpu --dtype float32 --prompt-len 32 \
        --new-tokens 64 --compile --out DIR   # BENCHMARKS.md's CPU rows
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch
from torch._dynamo.utils import counters

from harness import environment, timed, write_results  # noqa: E402  (first: the repository's packages)
from eval.decoding.batch import BatchGenerator  # noqa: E402
from eval.decoding.compiled_step import CompiledStep  # noqa: E402
from eval.decoding.static_route import StaticRoute  # noqa: E402
from framework.config import ModelConfig  # noqa: E402
from framework.model.decoder import Decoder  # noqa: E402

TINY = dict(vocab_size=512, d_model=64, n_layers=6, n_heads=2, max_seq_len=256)
CPU_BASE = dict(vocab_size=2048, d_model=64, n_layers=12, n_heads=2, ffn_mult=8, max_seq_len=128,
                attention="sdpa")  # recipes/cpu-base.yaml's decoder


def decode(generator: BatchGenerator, prompts: list[list[int]], new_tokens: int, device: str) -> list[list[int]]:
    items, _ = generator.generate(prompts, new_tokens)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    assert all(len(item.tokens) == new_tokens for item in items)
    return [item.tokens for item in items]


def median_seconds(generator: BatchGenerator, prompts: list[list[int]], args: argparse.Namespace
                   ) -> tuple[float, list]:
    """(median wall seconds of the timed runs, the tokens), after one untimed warm-up run."""
    decode(generator, prompts, args.new_tokens, args.device)
    runs = [timed(lambda: decode(generator, prompts, args.new_tokens, args.device)) for _ in range(args.repeats)]
    return statistics.median(wall for _, wall, _ in runs), runs[0][0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="504M",
                        help="a Table A.1 shape (271M … 8.2B), cpu-base (recipes/cpu-base.yaml's), or tiny (a smoke run)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--compile", action="store_true", help="also each case through compiled steps")
    parser.add_argument("--shapes", nargs="+", default=["static", "dynamic"], choices=("static", "dynamic"),
                        help="the compiled variants, in this order (default: both)")
    parser.add_argument("--out", required=True, help="folder for decoding.json")
    args = parser.parse_args(argv)
    cfg = ModelConfig(**{"tiny": TINY, "cpu-base": CPU_BASE}[args.shape]) if args.shape in ("tiny", "cpu-base") \
        else ModelConfig.paper(args.shape)
    torch.manual_seed(0)
    model = Decoder(cfg).to(device=args.device, dtype=getattr(torch, args.dtype)).eval()
    exit_layer = max(1, round(cfg.n_layers / 3))
    routes = {"full": StaticRoute(model), f"exit:{exit_layer}": StaticRoute(model, exit_layer=exit_layer)}
    rows = []
    for batch in (1, 8):
        prompts = torch.randint(0, cfg.vocab_size, (batch, args.prompt_len)).tolist()
        for name, route in routes.items():
            generator = BatchGenerator(model, route)
            seconds, eager_tokens = median_seconds(generator, prompts, args)
            eager = {"mode": name, "batch": batch, "compiled": False, "seconds": seconds,
                     "tokens_per_s": batch * args.new_tokens / seconds}
            rows.append(eager)
            print(f"{args.shape} {name:>8} batch {batch} eager: {eager['tokens_per_s']:,.0f} tokens/s", flush=True)
            write(rows, args)
            for shapes in args.shapes if args.compile else ():
                counters.clear()
                with CompiledStep.installed(model, static=shapes == "static") as compiled:
                    seconds, tokens = median_seconds(generator, prompts, args)
                rows.append({"mode": name, "batch": batch, "compiled": True, "shapes": shapes, "seconds": seconds,
                             "tokens_per_s": batch * args.new_tokens / seconds, "same_tokens": tokens == eager_tokens,
                             "vs_eager": eager["seconds"] / seconds, **compiled.summary(),
                             # graphs inductor could not record as CUDA graphs (0 where static shapes work)
                             "cudagraph_skips": counters["inductor"]["cudagraph_skips"]})
                print(f"{args.shape} {name:>8} batch {batch} compiled, {shapes} shapes: "
                      f"{rows[-1]['tokens_per_s']:,.0f} tokens/s ({rows[-1]['vs_eager']:.2f}x eager, "
                      f"{compiled.compile_seconds:.0f} s compiling, same tokens: {rows[-1]['same_tokens']})", flush=True)
                write(rows, args)
    return 0


def write(rows: list[dict], args: argparse.Namespace) -> None:
    """decoding.json with the rows so far, each with its tokens/s over the full model's (same
    batch, same compiled variant) where that row exists."""
    full = {(row["batch"], row.get("shapes")): row["tokens_per_s"] for row in rows if row["mode"] == "full"}
    for row in rows:
        if (row["batch"], row.get("shapes")) in full:
            row["vs_full"] = row["tokens_per_s"] / full[row["batch"], row.get("shapes")]
    write_results(Path(args.out) / "decoding.json",
                  {"shape": args.shape, "dtype": args.dtype, "prompt_len": args.prompt_len,
                   "new_tokens": args.new_tokens, "repeats": args.repeats, "compiled": args.compile,
                   "shapes": args.shapes if args.compile else [], "rows": rows,
                   "environment": environment(device=args.device)})


if __name__ == "__main__":
    sys.exit(main())

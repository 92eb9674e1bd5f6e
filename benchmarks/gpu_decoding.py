"""Decoding tokens/s at a paper shape, for benchmarks/gpu_check.sh: greedy, batch 1 and 8, the full
model and an early exit at L/3 (what an exit draft costs a token), eager.

Random weights (a speed figure needs no trained model: every token runs the same blocks), the
prompts random ids of ``--prompt-len`` tokens, ``--new-tokens`` new ones each (no EOS), one
untimed warm-up then ``--repeats`` timed runs, medians; on CUDA every timed run ends with a
synchronize. Compiled decoding is not measured: `generate` has no compiled path yet (#44 item 2).

    python benchmarks/gpu_decoding.py --shape 504M --device cuda --dtype bfloat16 --out DIR
    python benchmarks/gpu_decoding.py --shape tiny --device cpu --new-tokens 8 --repeats 1 --out DIR   # smoke
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

from harness import environment, write_results  # noqa: E402  (first: the repository's packages)
from eval.decoding.batch import BatchGenerator  # noqa: E402
from eval.decoding.static_route import StaticRoute  # noqa: E402
from framework.config import ModelConfig  # noqa: E402
from framework.model.decoder import Decoder  # noqa: E402

TINY = dict(vocab_size=512, d_model=64, n_layers=6, n_heads=2, max_seq_len=256)


def decode_seconds(generator: BatchGenerator, prompts: list[list[int]], new_tokens: int, device: str) -> float:
    started = time.perf_counter()
    items, _ = generator.generate(prompts, new_tokens)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    assert all(len(item.tokens) == new_tokens for item in items)
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="504M", help="a Table A.1 shape (271M … 8.2B), or tiny (a CPU smoke run)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", required=True, help="folder for decoding.json")
    args = parser.parse_args(argv)
    cfg = ModelConfig(**TINY) if args.shape == "tiny" else ModelConfig.paper(args.shape)
    torch.manual_seed(0)
    model = Decoder(cfg).to(device=args.device, dtype=getattr(torch, args.dtype)).eval()
    exit_layer = max(1, round(cfg.n_layers / 3))
    routes = {"full": StaticRoute(model), f"exit:{exit_layer}": StaticRoute(model, exit_layer=exit_layer)}
    rows = []
    for batch in (1, 8):
        prompts = torch.randint(0, cfg.vocab_size, (batch, args.prompt_len)).tolist()
        for name, route in routes.items():
            generator = BatchGenerator(model, route)
            decode_seconds(generator, prompts, args.new_tokens, args.device)  # warm-up
            seconds = statistics.median(decode_seconds(generator, prompts, args.new_tokens, args.device)
                                        for _ in range(args.repeats))
            rows.append({"mode": name, "batch": batch, "seconds": seconds,
                         "tokens_per_s": batch * args.new_tokens / seconds})
            print(f"{args.shape} {name:>8} batch {batch}: {rows[-1]['tokens_per_s']:,.0f} tokens/s", flush=True)
    full = {row["batch"]: row["tokens_per_s"] for row in rows if row["mode"] == "full"}
    for row in rows:
        row["vs_full"] = row["tokens_per_s"] / full[row["batch"]]
    write_results(Path(args.out) / "decoding.json",
                  {"shape": args.shape, "dtype": args.dtype, "prompt_len": args.prompt_len,
                   "new_tokens": args.new_tokens, "repeats": args.repeats, "compiled": False, "rows": rows,
                   "environment": environment(device=args.device)})
    return 0


if __name__ == "__main__":
    sys.exit(main())

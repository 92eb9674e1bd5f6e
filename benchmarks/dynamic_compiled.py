"""Dynamic early exit eager vs compiled, beside full decoding eager vs compiled, on a trained
model, in one process (BENCHMARKS.md, "Dynamic early exit compiled").

    python benchmarks/dynamic_compiled.py --ckpt RUN/checkpoints/last.ckpt --data DATA \\
        --threshold 0.1 --out benchmarks/results/compiled_decoding/dynamic_threshold_0.1.json

Held-out prompts of the data folder, every mode at batch 1 (one prompt after another) and at
the whole batch; the eager rows first, then the same with compiled steps installed (each mode's
first pass compiles, untimed). Tokens/s is the median of the repeats; blocks per token the
mode's own count (an early exit's K, the full model's L).
"""

from __future__ import annotations

import argparse
import statistics
from contextlib import nullcontext

from harness import timed, write_results  # first: puts the repository on the path

import torch

from eval.decoding import modes
from eval.decoding.compiled_step import CompiledStep
from eval.inputs import validation_prompts
from framework.checkpoint import Checkpoint


def measure(model, prompts: list[list[int]], spec: str, settings: dict, batch: int, new_tokens: int,
            repeats: int) -> dict:
    decode = modes.decoder(spec, model, modes.Settings(**settings))

    def once() -> list[float]:
        blocks = []
        for start in range(0, len(prompts), batch):
            items, _ = decode(prompts[start:start + batch], new_tokens)
            blocks += [cost for item in items for cost in item.blocks]
        return blocks

    once()  # warm-up: compiles where compiled
    runs = [timed(once) for _ in range(repeats)]
    blocks = runs[0][0]
    return {"tokens_per_s": statistics.median(len(prompts) * new_tokens / wall for _, wall, _ in runs),
            "blocks_per_token": sum(blocks) / len(blocks)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ckpt", required=True)
    p.add_argument("--data", required=True, help="a prepared folder: its validation split gives the prompts")
    p.add_argument("--threshold", type=float, default=0.1, help="the dynamic mode's confidence threshold")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    torch.set_num_threads(1)
    model, cfg = Checkpoint.open(args.ckpt).load_decoder(torch.device("cpu"))
    model.eval()
    prompts = validation_prompts(args.data, count=args.prompts, length=args.prompt_len,
                                 model_vocab_size=cfg.vocab_size)
    rows, summary = [], None
    for compiled in (False, True):
        with CompiledStep.installed(model) if compiled else nullcontext() as step:
            for batch in (1, args.prompts):
                for spec, settings in (("full", {}), ("dynamic", {"threshold": args.threshold})):
                    row = {"mode": spec, "compiled": compiled, "batch": batch,
                           **measure(model, prompts, spec, settings, batch, args.new_tokens, args.repeats)}
                    print(row, flush=True)
                    rows.append(row)
            if step is not None:
                summary = step.summary()
    write_results(args.out, {"ckpt": args.ckpt, "threshold": args.threshold, "prompts": args.prompts,
                             "prompt_len": args.prompt_len, "new_tokens": args.new_tokens, "rows": rows,
                             "compiled_summary": summary})


if __name__ == "__main__":
    main()

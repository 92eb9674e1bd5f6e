"""Decoding speed of every `layerdrop generate` mode, batched and one prompt at a time.

For each checkpoint (default: the demo model `make demo` trains), the same prompts (the
first validation sequences of the data it trained on) are decoded greedily, EOS
ignored so every mode writes the same number of tokens, in every mode at batch 1 (one
prompt after another) and at batch 8. Repetitions are interleaved (every mode and
batch size once, then again), medians kept; wall and process (CPU) time both recorded.

Reported, as ratios measured in this one run:
- tokens/s of each mode ÷ tokens/s of ``full`` at the same batch size;
- tokens/s at batch 8 ÷ tokens/s one by one, per mode (the goal: ≥ 4× for ``full`` on CPU);
- the dynamic-exit curve: agreement with full greedy and validation loss as decoded,
  against layers per token, for several thresholds (eval/decoding/threshold_curve.py).

Every mode is built by the mode registry (eval/decoding/modes/), as `layerdrop generate`
builds it.

    OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/generate_speed.py            # the demo model
    .venv/bin/python benchmarks/generate_speed.py --model ild=runs/x/checkpoints/last.ckpt --data data/builtin
    .venv/bin/python benchmarks/generate_speed.py --prompts 8 --max-new-tokens 8 --repeats 1   # a smoke test
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

from harness import REPO as ROOT, RESULTS, timed, write_results  # noqa: E402  (first: the repository's packages)
from eval.decoding import modes  # noqa: E402
from eval.decoding.batch import generate_in_batches  # noqa: E402
from eval.decoding.threshold_curve import curve  # noqa: E402
from eval.inputs import ValidationData, validation_prompts  # noqa: E402
from framework.checkpoint import load_decoder  # noqa: E402

DEMO = ROOT / "runs" / "demo"
THRESHOLDS = (0.0, 0.05, 0.1, 0.2, 0.3, 0.5, 0.9, 1.0)


def decoders(model, dynamic_threshold: float) -> dict:
    """mode name -> a generate(prompts, max_new_tokens, **kw) callable, from the registry."""
    half = max(1, len(model.blocks) // 2)
    return {"full": modes.decoder("full", model),
            f"exit:{half}": modes.decoder(f"exit:{half}", model),
            "skip:alternate-odd": modes.decoder("skip:alternate-odd", model),
            "speculative": modes.decoder("speculative", model),
            f"dynamic@{dynamic_threshold:g}": modes.decoder("dynamic", model,
                                                            modes.Settings(threshold=dynamic_threshold))}


def decoded(decode, prompts, batch_size: int, max_new_tokens: int) -> dict:
    (items, stats), wall, cpu = timed(lambda: generate_in_batches(decode, prompts, batch_size,
                                                                  max_new_tokens=max_new_tokens))
    tokens = sum(len(item.tokens) for item in items)
    return {"wall": wall, "cpu": cpu, "tokens": tokens, "outputs": [item.tokens for item in items],
            **{k: v for k, v in stats.summary().items() if k in ("layers_per_token", "acceptance_rate")}}


def measure(name: str, ckpt: Path, data: Path, args: argparse.Namespace) -> dict:
    model, cfg = load_decoder(ckpt)
    prompts = validation_prompts(str(data), count=args.prompts, length=args.prompt_len,
                                 model_vocab_size=cfg.vocab_size)
    modes = decoders(model, args.dynamic_threshold)
    runs: dict[tuple[str, int], list[dict]] = {(m, b): [] for m in modes for b in args.batch_sizes}
    for mode, decode in modes.items():  # warm-up, untimed
        decoded(decode, prompts[:2], 2, 4)
    for _ in range(args.repeats):
        for mode, decode in modes.items():
            for batch in args.batch_sizes:
                runs[(mode, batch)].append(decoded(decode, prompts, batch, args.max_new_tokens))
    rows = {}
    for (mode, batch), samples in runs.items():
        rows.setdefault(mode, {})[str(batch)] = {
            "tokens": samples[0]["tokens"],
            "tokens_per_s_wall": statistics.median(s["tokens"] / s["wall"] for s in samples),
            "tokens_per_s_cpu": statistics.median(s["tokens"] / s["cpu"] for s in samples),
            "layers_per_token": samples[0].get("layers_per_token"),
            "acceptance_rate": samples[0].get("acceptance_rate"),
            "walls": [s["wall"] for s in samples], "cpus": [s["cpu"] for s in samples]}
    full = {b: rows["full"][str(b)] for b in args.batch_sizes}
    one, most = str(min(args.batch_sizes)), str(max(args.batch_sizes))
    for mode, by_batch in rows.items():
        for batch, row in by_batch.items():
            for clock in ("wall", "cpu"):
                row[f"vs_full_{clock}"] = row[f"tokens_per_s_{clock}"] / full[int(batch)][f"tokens_per_s_{clock}"]
        for clock in ("wall", "cpu"):
            by_batch[f"batched_vs_one_by_one_{clock}"] = (by_batch[most][f"tokens_per_s_{clock}"]
                                                           / by_batch[one][f"tokens_per_s_{clock}"])
    lossless = runs[("speculative", int(one))][0]["outputs"] == runs[("full", int(one))][0]["outputs"]
    batches = list(ValidationData(str(data), seq_len=cfg.max_seq_len, batch_size=8, max_tokens=None,
                                  max_batches=args.loss_batches, model_vocab_size=cfg.vocab_size))
    dynamic = curve(model, prompts, batches, thresholds=THRESHOLDS, max_new_tokens=args.max_new_tokens,
                    batch_size=max(args.batch_sizes))
    return {"ckpt": str(ckpt), "num_layers": cfg.n_layers, "d_model": cfg.d_model, "vocab_size": cfg.vocab_size,
            "modes": rows, "speculative_identical_to_full": lossless, "dynamic_curve": dynamic}


def table(results: dict) -> str:
    sizes = results["batch_sizes"]
    one, most = min(sizes), max(sizes)
    lines = [f"| model | mode | tokens/s batch {one} (vs full) | tokens/s batch {most} (vs full) | batch {most} ÷ "
             f"one by one | layers/token |", "|---|---|---|---|---|---|"]
    for name, model in results["models"].items():
        for mode, row in model["modes"].items():
            a, b = row[str(one)], row[str(most)]
            lines.append(f"| {name} | {mode} | {a['tokens_per_s_cpu']:.0f} ({a['vs_full_cpu']:.2f}×) | "
                         f"{b['tokens_per_s_cpu']:.0f} ({b['vs_full_cpu']:.2f}×) | "
                         f"{row['batched_vs_one_by_one_cpu']:.2f}× (wall {row['batched_vs_one_by_one_wall']:.2f}×) | "
                         f"{a['layers_per_token']:.2f} |")
    lines += ["", "| model | threshold | layers/token | agreement with full | prefix agreement | loss as decoded |",
              "|---|---|---|---|---|---|"]
    for name, model in results["models"].items():
        for r in model["dynamic_curve"]["thresholds"]:
            lines.append(f"| {name} | {r['threshold']:g} | {r['layers_per_token']:.2f} | {r['agreement']:.1%} | "
                         f"{r['prefix_agreement']:.1%} | {r['loss']:.4f} |")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", action="append", default=None, metavar="NAME=CKPT",
                   help="a checkpoint (repeatable; default: demo=runs/demo/tiny/checkpoints/last.ckpt)")
    p.add_argument("--data", type=Path, default=DEMO / "data", help="prepared folder: prompts and loss")
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    p.add_argument("--dynamic-threshold", type=float, default=0.1, help="the dynamic mode's row (the curve has more)")
    p.add_argument("--loss-batches", type=int, default=4, help="validation batches of the dynamic curve's loss")
    p.add_argument("--repeats", type=int, default=3, help="interleaved repetitions (median kept)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", type=Path, default=RESULTS / "generate_speed.json")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    models = dict(spec.split("=", 1) for spec in (args.model or [f"demo={DEMO / 'tiny/checkpoints/last.ckpt'}"]))
    for name, path in models.items():
        if not Path(path).exists():
            p.error(f"checkpoint {path!r} ({name}) does not exist: run `make demo` or pass --model NAME=CKPT")
    started = time.perf_counter()
    results = {"benchmark": "generate_speed", "threads": args.threads, "batch_sizes": args.batch_sizes,
               "prompts": args.prompts, "prompt_len": args.prompt_len, "max_new_tokens": args.max_new_tokens,
               "repeats": args.repeats, "torch": torch.__version__, "machine": platform.machine(),
               "load_average_before": os.getloadavg(), "models": {}}
    for name, path in models.items():
        print(f"measuring {name} ({path}) ...", flush=True)
        results["models"][name] = measure(name, Path(path), args.data, args)
    results["load_average_after"] = os.getloadavg()
    results["seconds"] = time.perf_counter() - started
    results["table"] = table(results)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_results(args.out, results)
    print(results["table"])
    print(f"wrote {args.out} ({results['seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

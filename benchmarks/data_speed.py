"""Is the data path fast enough? Prepare and streaming rates vs. what training consumes.

1. prepare: `layerdrop prepare --corpus builtin --tokenizer train --vocab-size 8192
   --max-tokens N` in this process (N = 3M, the tiny recipe's command, by default);
   tokens written per second of wall time and per CPU second (this process, its
   tokenizer threads and the forked chunk writers).
2. streaming: `TokenDataModule` over that folder, the train loader at the tiny
   recipe's shape (batch 8 x seq 128), with 0 and 2 loader workers; tokens per
   second over ``--batches`` batches after one warm-up batch.
3. consumption: tokens per second of one training step of the tiny recipe's model
   (framework.model.Decoder, d=256, L=6, 4 heads, vocab 8192, the same batch):
   forward + cross-entropy + backward + AdamW step, dense (layer dropout only makes
   steps faster, so dense is the demanding case), median of ``--steps`` steps. Or
   give it with ``--train-tokens-per-s``.

ratio = streaming tokens/s / consumed tokens/s; the goal is >= 20. Results go to
benchmarks/results/data_speed.json and a markdown table on stdout. Wall times on a
shared machine vary with its load; the load average is recorded beside them.

    .venv/bin/python benchmarks/data_speed.py
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # no spinning OpenMP threads on shared cores

from harness import RESULTS as RESULTS_DIR, timed, write_results  # noqa: E402  (first: the repository's packages)
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from data_prep.prepare import main as prepare  # noqa: E402
from framework.training.data import TokenDataModule  # noqa: E402

RESULTS = RESULTS_DIR / "data_speed.json"
GOAL_RATIO = 20


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--max-tokens", default="3M", help="prepare's --max-tokens (default: 3M)")
    parser.add_argument("--vocab-size", type=int, default=8192)
    parser.add_argument("--batch-size", type=int, default=8, help="recipes/tiny.yaml: data.batch_size")
    parser.add_argument("--seq-len", type=int, default=128, help="recipes/tiny.yaml: data.seq_len")
    parser.add_argument("--batches", type=int, default=1000, help="streamed batches per measurement")
    parser.add_argument("--steps", type=int, default=8, help="timed training steps")
    parser.add_argument("--train-tokens-per-s", type=float, help="skip step 3 and use this rate")
    parser.add_argument("--out", type=Path, default=RESULTS)
    return parser.parse_args(argv)


def measure_prepare(folder: str, args: argparse.Namespace) -> dict:
    code, wall, cpu = timed(lambda: prepare(["--corpus", "builtin", "--tokenizer", "train", "--vocab-size",
                                             str(args.vocab_size), "--max-tokens", args.max_tokens, "--out", folder,
                                             "--no-progress"]), cpu="all")
    assert code == 0
    with open(os.path.join(folder, "manifest.json")) as handle:
        tokens = sum(split["tokens"] for split in json.load(handle)["splits"].values())
    return {"tokens": tokens, "wall_s": wall, "cpu_s": cpu, "tokens_per_s": tokens / wall,
            "tokens_per_cpu_s": tokens / cpu}


def measure_streaming(folder: str, args: argparse.Namespace, num_workers: int) -> dict:
    module = TokenDataModule(folder, seq_len=args.seq_len, batch_size=args.batch_size, num_workers=num_workers)
    module.setup("fit")
    batches = iter(module.train_dataloader())
    next(batches)  # warm-up: opens chunks, starts workers
    started = time.perf_counter()
    for _ in range(args.batches):
        inputs, _ = next(batches)
    seconds = time.perf_counter() - started
    tokens = args.batches * args.batch_size * args.seq_len
    return {"num_workers": num_workers, "batches": args.batches, "wall_s": seconds, "tokens_per_s": tokens / seconds}


def measure_training(args: argparse.Namespace) -> dict:
    from framework.config import ModelConfig
    from framework.model.decoder import Decoder

    torch.manual_seed(0)
    config = ModelConfig(vocab_size=args.vocab_size, d_model=256, n_layers=6, n_heads=4,
                         max_seq_len=args.seq_len, attention="sdpa")
    model = Decoder(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tokens = torch.randint(0, args.vocab_size, (args.batch_size, args.seq_len + 1))
    times = []
    for step in range(args.steps + 1):
        started = time.perf_counter()
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step:  # step 0 warms up allocators and kernels
            times.append(time.perf_counter() - started)
    seconds = statistics.median(times)
    return {"parameters": sum(p.numel() for p in model.parameters()), "step_s": seconds,
            "tokens_per_s": args.batch_size * args.seq_len / seconds}


def table(results: dict) -> str:
    prep, train = results["prepare"], results["training"]
    rows = ["| measurement | tokens/s | notes |", "|---|---:|---|",
            f"| prepare (builtin, vocab {results['config']['vocab_size']}) | {prep['tokens_per_s']:,.0f} | "
            f"{prep['tokens']:,} tokens in {prep['wall_s']:.1f} s wall, {prep['cpu_s']:.1f} CPU-s "
            f"({prep['tokens_per_cpu_s']:,.0f} tokens/CPU-s) |"]
    for stream in results["streaming"]:
        rows.append(f"| streaming, {stream['num_workers']} loader workers | {stream['tokens_per_s']:,.0f} | "
                    f"{stream['ratio_to_training']:.0f}x the training step's consumption |")
    rows.append(f"| training consumption (tiny recipe step) | {train['tokens_per_s']:,.0f} | "
                f"{train.get('source', 'measured')}; goal: streaming >= {GOAL_RATIO}x |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        folder = os.path.join(tmp, "builtin")
        prepared = measure_prepare(folder, args)
        streaming = [measure_streaming(folder, args, workers) for workers in (0, 2)]
    if args.train_tokens_per_s:
        training = {"tokens_per_s": args.train_tokens_per_s, "source": "given with --train-tokens-per-s"}
    else:
        training = {**measure_training(args), "source": "measured: d=256, L=6 fwd+bwd+AdamW"}
    for stream in streaming:
        stream["ratio_to_training"] = stream["tokens_per_s"] / training["tokens_per_s"]
    results = {
        "config": {key: value for key, value in vars(args).items() if key != "out"},
        "machine": {"cpus": os.cpu_count(), "load_average_1m": os.getloadavg()[0], "python": platform.python_version(),
                    "torch": torch.__version__},
        "prepare": prepared, "streaming": streaming, "training": training,
        "min_ratio": min(stream["ratio_to_training"] for stream in streaming), "goal_ratio": GOAL_RATIO,
    }
    results["config"]["max_tokens"] = str(args.max_tokens)
    write_results(args.out, results)
    print(table(results))
    print(f"\nwritten to {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

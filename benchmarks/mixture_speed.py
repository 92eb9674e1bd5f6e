"""Does a data mixture stream as fast as one folder? The train loader's tokens/s over one
prepared folder vs a two-source mixture of it (framework/training/data/mixture_loader.py), same
batch shape, measured in one run, repetitions interleaved.

The two sources are the two halves of the same builtin corpus prepared with one tokenizer
(`layerdrop prepare --corpus builtin:code` / `builtin:prose`), and the one folder is the code
half alone, so both read the same kind of chunks; the mixture draws 50/50. For each loader
worker count (0 and 2): ``--reps`` interleaved repetitions of ``--batches`` batches (rounded up to whole
blocks of the mixture's draws, ``BLOCK``) after one block of warm-up batches, a fresh loader
each time, so the mixture's reading ahead is inside the timed batches, never before them; the median tokens/s of wall time and per CPU second
(this process and its loader workers), and the ratio mixture / one folder (goal >= 0.9).

    .venv/bin/python benchmarks/mixture_speed.py --data-root DIR   # DIR: where the two halves are prepared
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from harness import RESULTS, environment, timed, write_results  # noqa: E402  (first: the repository's packages)

SEQ, BATCH = 128, 8  # the tiny recipe's batch


def prepare_halves(root: Path, max_tokens: str) -> dict[str, str]:
    from data_prep.prepare import main as prepare

    code, prose = root / "code", root / "prose"
    if not (code / "manifest.json").is_file():
        assert prepare(["--corpus", "builtin:code", "--tokenizer", "train", "--vocab-size", "8192",
                        "--max-tokens", max_tokens, "--no-progress", "--out", str(code)]) == 0
    if not (prose / "manifest.json").is_file():
        assert prepare(["--corpus", "builtin:prose", "--tokenizer", str(code / "tokenizer.json"),
                        "--max-tokens", max_tokens, "--no-progress", "--out", str(prose)]) == 0
    return {"code": str(code), "prose": str(prose)}


def loader(halves: dict[str, str], mixture: bool, workers: int):
    from framework.training.data import TokenDataModule

    settings = dict(seq_len=SEQ, batch_size=BATCH, num_workers=workers, seed=0)
    if mixture:
        module = TokenDataModule(mixture={name: {"dir": folder, "weight": 1} for name, folder in halves.items()},
                                 **settings)
    else:
        module = TokenDataModule(halves["code"], **settings)
    module.setup("fit")
    return module.train_dataloader()


def tokens_per_second(halves: dict[str, str], mixture: bool, workers: int, batches: int) -> tuple[float, float]:
    batches_iter = iter(loader(halves, mixture, workers))
    from framework.training.data.mixture_loader import BLOCK

    # warm-up (workers started, first chunks mapped) to a block's end: the next block is read in the timing
    sum(1 for _ in itertools.islice(batches_iter, BLOCK))
    _, wall, cpu = timed(lambda: sum(1 for _ in itertools.islice(batches_iter, batches)), cpu="all")
    tokens = batches * BATCH * SEQ
    return tokens / wall, tokens / cpu


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-root", required=True, help="folder for the two prepared halves (reused if there)")
    parser.add_argument("--max-tokens", default="3M", help="tokens per half (default 3M)")
    parser.add_argument("--batches", type=int, default=320, help="timed batches per repetition, rounded up to whole blocks (default 320)")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--out", default=str(RESULTS / "mixture_speed.json"))
    args = parser.parse_args(argv)
    from framework.training.data.mixture_loader import BLOCK

    args.batches = -(-args.batches // BLOCK) * BLOCK
    halves = prepare_halves(Path(args.data_root), args.max_tokens)
    rows = []
    for workers in (0, 2):
        samples: dict[str, list[tuple[float, float]]] = {"one folder": [], "mixture": []}
        for _ in range(args.reps):  # interleaved: the machine's load drifts alike for both
            for name, mixture in (("one folder", False), ("mixture", True)):
                samples[name].append(tokens_per_second(halves, mixture, workers, args.batches))
        medians = {name: (statistics.median(s[0] for s in v), statistics.median(s[1] for s in v))
                   for name, v in samples.items()}
        rows.append({"workers": workers, "samples": samples,
                     "one_folder_tokens_per_s": medians["one folder"][0], "mixture_tokens_per_s": medians["mixture"][0],
                     "one_folder_tokens_per_cpu_s": medians["one folder"][1],
                     "mixture_tokens_per_cpu_s": medians["mixture"][1],
                     "ratio_wall": medians["mixture"][0] / medians["one folder"][0],
                     "ratio_cpu": medians["mixture"][1] / medians["one folder"][1]})
    write_results(args.out, {"batch": BATCH, "seq_len": SEQ, "batches": args.batches, "reps": args.reps,
                             "rows": rows, "environment": environment()})
    print("| loader workers | one folder (tokens/s) | mixture of 2 (tokens/s) | mixture / one (wall) | "
          "mixture / one (CPU) |")
    print("|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['workers']} | {row['one_folder_tokens_per_s']:,.0f} | {row['mixture_tokens_per_s']:,.0f} | "
              f"{row['ratio_wall']:.2f} | {row['ratio_cpu']:.2f} |")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

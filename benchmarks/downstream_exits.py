"""What does the downstream suite at every exit cost in one run, next to one run per exit?

Two ways to get Table A.3 with the exit as a dimension, for the same model and documents:

  (a) one pass:  `layerdrop eval downstream --exit-layers all`: the model loads once, each
                 log-likelihood request runs the blocks once and every exit reads its state
                 (eval/downstream/exits_table.py);
  (b) per exit:  `layerdrop eval downstream --exit-layer K` for K = 1..L, one command each.

Both go through the command's own entry point in this process (its task building, lm-eval's
request building and metrics included), so the ratio is what a user saves. The accuracies
of (a) are checked equal to (b)'s at every exit. The models are random (the cost does not
depend on the weights) with the shapes of the reproduction's CPU base and of the tiny
recipe, and the prepared data's tokenizer. Repetitions alternate the two ways; medians of
wall and process-CPU time are reported (CPU time is the figure to trust on a shared machine).

    .venv/bin/python benchmarks/downstream_exits.py --tokenizer data/builtin-2k/tokenizer.json
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch starts OpenMP

from harness import RESULTS as RESULTS_DIR, environment, timed, write_results  # noqa: E402  (first: the repository's packages)
import torch  # noqa: E402

from eval.downstream import harness  # noqa: E402
from framework.checkpoint import export_decoder  # noqa: E402
from framework.files.atomic_write import copy_file  # noqa: E402
from framework.config import ModelConfig  # noqa: E402
from framework.model.decoder import Decoder  # noqa: E402

RESULTS = RESULTS_DIR / "downstream_exits.json"
# name -> (d_model, n_layers, n_heads): the vocabulary is the tokenizer's
SHAPES = {"CPU base (d64 L12)": (64, 12, 2), "tiny recipe (d256 L6)": (256, 6, 4)}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokenizer", type=Path, default=Path("data/builtin-2k/tokenizer.json"),
                        help="a tokenizer.json (default: the prepared builtin data's)")
    parser.add_argument("--tasks", nargs="+", default=["piqa", "arc_easy"])
    parser.add_argument("--limit", type=int, default=100, help="documents per task")
    parser.add_argument("--reps", type=int, default=2, help="timed rounds of each way per shape")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seq-len", type=int, default=512, help="the models' context")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if not args.tokenizer.is_file():
        parser.error(f"--tokenizer {str(args.tokenizer)!r} does not exist: prepare data first (`layerdrop prepare "
                     "--corpus builtin --tokenizer train --vocab-size 2048 --out data/builtin-2k`) or pass one")
    return args


def _command(argv: list[str]) -> tuple[float, float]:
    def quietly() -> int:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            return harness.main(argv)
    code, wall, cpu = timed(quietly)
    if code != 0:
        raise RuntimeError(f"eval downstream {' '.join(argv)} exited {code}")
    return wall, cpu


def measure(name: str, shape: tuple[int, int, int], args: argparse.Namespace, scratch: Path) -> dict:
    from tokenizers import Tokenizer

    d, n_layers, heads = shape
    vocab = Tokenizer.from_file(str(args.tokenizer)).get_vocab_size()
    torch.manual_seed(0)
    decoder = Decoder(ModelConfig(vocab_size=vocab, d_model=d, n_layers=n_layers, n_heads=heads,
                                  max_seq_len=args.seq_len, attention="sdpa"))
    decoder.init_weights(std=0.2)
    folder = scratch / name.split(" (")[0].replace(" ", "-")
    export_decoder(decoder.eval(), folder)
    copy_file(args.tokenizer, folder / "tokenizer.json")
    common = ["--ckpt", str(folder), "--tasks", *args.tasks, "--limit", str(args.limit), "--bootstrap-iters", "0",
              "--overwrite"]
    one_pass = [*common, "--exit-layers", "all", "--out", str(scratch / "all.json")]
    per_exit = [[*common, "--exit-layer", str(k), "--out", str(scratch / f"exit-{k}.json")]
                for k in range(1, n_layers + 1)]

    def run(way: str) -> tuple[float, float]:
        if way == "one_pass":
            return _command(one_pass)
        times = [_command(argv) for argv in per_exit]
        return sum(t[0] for t in times), sum(t[1] for t in times)

    samples: dict[str, list[tuple[float, float]]] = {"one_pass": [], "per_exit": []}
    for rep in range(args.reps):
        for way in (("one_pass", "per_exit") if rep % 2 == 0 else ("per_exit", "one_pass")):
            samples[way].append(run(way))
    table = json.loads((scratch / "all.json").read_text())["table"]
    separate = {str(k): json.loads((scratch / f"exit-{k}.json").read_text())["summary"]
                for k in range(1, n_layers + 1)}
    identical = all(table[task][k] == separate[k][task]["value"] for task in table for k in separate)
    wall = {w: statistics.median(t[0] for t in s) for w, s in samples.items()}
    cpu = {w: statistics.median(t[1] for t in s) for w, s in samples.items()}
    return {"d_model": d, "n_layers": n_layers, "vocab_size": vocab, "median_wall_s": wall, "median_cpu_s": cpu,
            "per_exit_over_one_pass_wall": wall["per_exit"] / wall["one_pass"],
            "per_exit_over_one_pass_cpu": cpu["per_exit"] / cpu["one_pass"],
            "identical_accuracies": identical}


def markdown(result: dict) -> str:
    config = result["config"]
    rows = ["| model | exits | one pass (CPU s) | per exit (CPU s) | per exit ÷ one pass (CPU) | (wall) "
            "| same accuracies |", "|---|---|---|---|---|---|---|"]
    for name, r in result["shapes"].items():
        rows.append(f"| {name} | {r['n_layers']} | {r['median_cpu_s']['one_pass']:.1f} "
                    f"| {r['median_cpu_s']['per_exit']:.1f} | {r['per_exit_over_one_pass_cpu']:.2f}× "
                    f"| {r['per_exit_over_one_pass_wall']:.2f}× | {r['identical_accuracies']} |")
    return "\n".join(rows) + (f"\n\n{', '.join(config['tasks'])}, {config['limit']} documents each, "
                              f"{config['reps']} rounds, {config['threads']} thread(s)")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()[0]
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as scratch:
        shapes = {name: measure(name, shape, args, Path(scratch)) for name, shape in SHAPES.items()}
    result = {"config": {"tasks": args.tasks, "limit": args.limit, "reps": args.reps, "threads": args.threads,
                         "seq_len": args.seq_len},
              "shapes": shapes, "elapsed_s": round(time.perf_counter() - start, 1),
              "environment": environment(load_avg_1min=[load_before, os.getloadavg()[0]])}
    write_results(args.out, result)
    print(markdown(result))
    print(f"wrote {args.out}")
    return 0 if all(r["identical_accuracies"] for r in shapes.values()) else 1


if __name__ == "__main__":
    sys.exit(main())

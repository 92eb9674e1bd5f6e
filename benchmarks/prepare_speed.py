"""Is `layerdrop prepare` as fast as the plain loop it wraps, and how long would 100 B tokens take?

The corpus: the builtin corpus's documents (stdlib code + rendered man pages) written as
``--files`` JSON-lines files compressed with zstandard (the form Dolma and RedPajama ship),
``--corpus-mb`` MB of text in all; the tokenizer: a byte-level BPE (vocab ``--vocab-size``)
trained on it once, given to both sides as a file.

1. prepare: `layerdrop prepare --jsonl DIR/*.jsonl.zst --tokenizer FILE --workers 1` in this
   process: the record check pass, the flat token file in a staging folder, the chunk
   writer (litdata ``optimize``, one forked worker), the manifest and the swap into place.
2. plain loop: the same files read with zstandard's ``stream_reader`` and ``json.loads``,
   the same tokenizer's ``encode_batch_fast`` on batches of 256 documents, EOS appended,
   each document routed to train/val by the same hash, and each split's tokens cut into
   the same ``TokensLoader`` chunks with litdata's ``BinaryWriter`` (no checks, no staging,
   no flat file). Its token streams are checked equal to prepare's, split by split.

ratio = prepare tokens/s / plain tokens/s (goal >= 0.8), from the medians of
``--repeats`` interleaved repetitions (the order alternates), on wall time and on CPU
time (this process + its waited-for children: prepare's chunk writer). One tokenizer
thread (RAYON_NUM_THREADS=1): a part of a sharded prepare is one process per core. The
hours for 100 B tokens on N machines of C cores assume C parts per machine, each at the
measured per-CPU-second rate (parts share nothing, so they scale with cores until the
disks or memory bandwidth saturate: not measured on this 2-core machine).

    .venv/bin/python benchmarks/prepare_speed.py
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

os.environ["RAYON_NUM_THREADS"] = "1"  # before tokenizers starts its thread pool
os.environ.setdefault("OMP_NUM_THREADS", "1")

from harness import RESULTS as RESULTS_DIR, environment, timed, write_results  # noqa: E402

import numpy as np  # noqa: E402
import zstandard  # noqa: E402
from litdata import TokensLoader  # noqa: E402
from litdata.streaming.writer import BinaryWriter  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402

from data_prep.chunks import read_split_tokens  # noqa: E402
from data_prep.prepare import main as prepare  # noqa: E402
from data_prep.split import SPLITS, split_key, split_of  # noqa: E402
from framework.files.atomic_write import replacing, write_text  # noqa: E402

RESULTS = RESULTS_DIR / "prepare_speed.json"
GOAL_RATIO = 0.8
TARGET_TOKENS = 100e9
MACHINES = (1, 8, 32)
CORES_PER_MACHINE = 64
BATCH_DOCUMENTS = 256


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--corpus-mb", type=float, default=24, help="MB of text in the corpus (default: 24)")
    parser.add_argument("--files", type=int, default=4, help=".jsonl.zst files the corpus is cut into")
    parser.add_argument("--vocab-size", type=int, default=8192)
    parser.add_argument("--chunk-tokens", type=int, default=2**21, help="prepare's default chunk size")
    parser.add_argument("--val-fraction", type=float, default=0.01)
    parser.add_argument("--repeats", type=int, default=5, help="interleaved repetitions of each side")
    parser.add_argument("--out", type=Path, default=RESULTS)
    return parser.parse_args(argv)


def write_corpus(folder: Path, megabytes: float, files: int) -> tuple[list[str], int]:
    """The builtin corpus's first ``megabytes`` of text as ``files`` .jsonl.zst files; (paths, documents)."""
    from data_prep.builtin_corpus import BuiltinSource
    from data_prep.sources.document import SourceStats

    texts, size = [], 0
    for doc in BuiltinSource().documents(SourceStats()):
        texts.append(doc.text)
        size += len(doc.text.encode())
        if size >= megabytes * 1e6:
            break
    paths = []
    for number in range(files):
        path = folder / f"part-{number:02d}.jsonl.zst"
        lines = "".join(json.dumps({"text": text}) + "\n" for text in texts[number::files])
        with replacing(path) as partial, open(partial, "wb") as handle:
            handle.write(zstandard.ZstdCompressor(level=3).compress(lines.encode()))
        paths.append(str(path))
    return paths, len(texts)


def train_tokenizer_file(paths: list[str], vocab_size: int, path: Path) -> str:
    from data_prep.trained_tokenizer import train_tokenizer

    tokenizer = train_tokenizer((json.loads(line)["text"] for p in paths for line in _lines(p)), vocab_size)
    write_text(path, tokenizer.to_str())
    return str(path)


def _lines(path: str):
    with open(path, "rb") as handle:
        yield from io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(handle))


class _SplitWriter:
    """One split's tokens -> TokensLoader chunks of exactly ``chunk_tokens`` (the last shorter)."""

    def __init__(self, folder: str, chunk_tokens: int) -> None:
        self.writer = BinaryWriter(folder, chunk_size=chunk_tokens, item_loader=TokensLoader())
        self.chunk_tokens, self.pending, self.buffered, self.items = chunk_tokens, [], 0, 0

    def add(self, ids: np.ndarray) -> None:
        self.pending.append(ids)
        self.buffered += len(ids)
        if self.buffered >= self.chunk_tokens:
            self._emit(final=False)

    def _emit(self, final: bool) -> None:
        tokens = np.concatenate(self.pending)
        whole = len(tokens) if final else len(tokens) // self.chunk_tokens * self.chunk_tokens
        for start in range(0, whole, self.chunk_tokens):
            self.writer.add_item(self.items, tokens[start:start + self.chunk_tokens])
            self.items += 1
        self.pending, self.buffered = [tokens[whole:]], len(tokens) - whole

    def close(self) -> None:
        if self.buffered:
            self._emit(final=True)
        if self.items:  # litdata's merge waits for an index that an empty writer never writes
            self.writer.done()
            self.writer.merge()


def plain_loop(paths: list[str], tokenizer_file: str, out: str, chunk_tokens: int, val_fraction: float) -> int:
    """Read, encode, split and chunk in one pass; returns the tokens written."""
    tokenizer = Tokenizer.from_file(tokenizer_file)
    tokenizer.encode_special_tokens = True  # as prepare: a special token's text in a document is text
    eos = tokenizer.token_to_id("<|endoftext|>")
    dtype = np.uint16 if tokenizer.get_vocab_size() <= 2**16 else np.uint32
    writers = [_SplitWriter(os.path.join(out, name), chunk_tokens) for name in SPLITS]
    total, batch = 0, []

    def flush() -> int:
        written = 0
        for text, encoding in zip(batch, tokenizer.encode_batch_fast(batch, add_special_tokens=False)):
            ids = np.empty(len(encoding.ids) + 1, dtype=dtype)
            ids[:-1] = encoding.ids
            ids[-1] = eos
            writers[split_of(split_key(text, 0), val_fraction)].add(ids)
            written += len(ids)
        batch.clear()
        return written

    for path in paths:
        for line in _lines(path):
            text = json.loads(line)["text"]
            if text.strip():
                batch.append(text)
            if len(batch) == BATCH_DOCUMENTS:
                total += flush()
    total += flush()
    for writer in writers:
        writer.close()
    return total


def run_prepare(paths: list[str], tokenizer_file: str, out: str, args: argparse.Namespace) -> int:
    folder = os.path.dirname(paths[0])
    code = prepare(["--jsonl", os.path.join(folder, "*.jsonl.zst"), "--tokenizer", tokenizer_file, "--out", out,
                    "--workers", "1", "--chunk-tokens", str(args.chunk_tokens), "--val-fraction",
                    str(args.val_fraction), "--no-progress"])
    assert code == 0
    with open(os.path.join(out, "manifest.json")) as handle:
        return sum(split["tokens"] for split in json.load(handle)["splits"].values())


def same_tokens(prepared: str, plain: str) -> bool:
    dtype = json.loads(Path(prepared, "manifest.json").read_text())["dtype"]
    return all(np.array_equal(read_split_tokens(os.path.join(prepared, name), dtype),
                              read_split_tokens(os.path.join(plain, name), dtype)) for name in SPLITS)


def measure(paths: list[str], tokenizer_file: str, work: Path, args: argparse.Namespace) -> dict:
    samples: dict[str, list[dict]] = {"prepare": [], "plain": []}
    checked = False
    for repeat in range(args.repeats):
        order = ("prepare", "plain") if repeat % 2 == 0 else ("plain", "prepare")
        for side in order:
            out = str(work / f"{side}-{repeat}")
            if side == "prepare":
                tokens, wall, cpu = timed(lambda: run_prepare(paths, tokenizer_file, out, args), cpu="all")
            else:
                tokens, wall, cpu = timed(lambda: plain_loop(paths, tokenizer_file, out, args.chunk_tokens,
                                                             args.val_fraction), cpu="all")
            samples[side].append({"repeat": repeat, "tokens": tokens, "wall_s": wall, "cpu_s": cpu,
                                  "load_avg_1min": os.getloadavg()[0]})
        if not checked:  # the plain loop wrote the same chunks' tokens: the comparison is fair
            assert same_tokens(str(work / "prepare-0"), str(work / "plain-0")), "plain loop and prepare differ"
            checked = True
        for side in samples:
            shutil.rmtree(work / f"{side}-{repeat}")
    return samples


def summary(samples: dict[str, list[dict]]) -> dict:
    result = {}
    for side, runs in samples.items():
        tokens = runs[0]["tokens"]
        result[side] = {"tokens": tokens, "wall_s_median": statistics.median(r["wall_s"] for r in runs),
                        "cpu_s_median": statistics.median(r["cpu_s"] for r in runs)}
        result[side]["tokens_per_s"] = tokens / result[side]["wall_s_median"]
        result[side]["tokens_per_cpu_s"] = tokens / result[side]["cpu_s_median"]
    result["ratio_wall"] = result["prepare"]["tokens_per_s"] / result["plain"]["tokens_per_s"]
    result["ratio_cpu"] = result["prepare"]["tokens_per_cpu_s"] / result["plain"]["tokens_per_cpu_s"]
    return result


def hours_for(target_tokens: float, tokens_per_cpu_s: float, cores: int, machines: int) -> float:
    """Hours for ``target_tokens`` on ``machines`` machines of ``cores`` cores, one one-thread part per core."""
    return target_tokens / (tokens_per_cpu_s * cores * machines) / 3600


def table(result: dict) -> str:
    rows = ["| side | tokens | wall s (median) | CPU s (median) | tokens/s wall | tokens/CPU-s |",
            "|---|---:|---:|---:|---:|---:|"]
    for side in ("prepare", "plain"):
        r = result[side]
        rows.append(f"| {side} | {r['tokens']:,} | {r['wall_s_median']:.1f} | {r['cpu_s_median']:.1f} | "
                    f"{r['tokens_per_s']:,.0f} | {r['tokens_per_cpu_s']:,.0f} |")
    rows.append(f"\nratio prepare/plain: {result['ratio_wall']:.2f} (wall), {result['ratio_cpu']:.2f} (CPU); "
                f"goal >= {GOAL_RATIO}")
    for machines, hours in result["hours_for_100B"].items():
        rows.append(f"100 B tokens on {machines} machine(s) x {CORES_PER_MACHINE} cores: {hours:.2f} h "
                    f"({hours * 60:.0f} min)")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "corpus").mkdir()
        paths, documents = write_corpus(work / "corpus", args.corpus_mb, args.files)
        tokenizer_file = train_tokenizer_file(paths, args.vocab_size, work / "tokenizer.json")
        samples = measure(paths, tokenizer_file, work, args)
    result = summary(samples)
    rate = result["prepare"]["tokens_per_cpu_s"]
    result["hours_for_100B"] = {str(m): hours_for(TARGET_TOKENS, rate, CORES_PER_MACHINE, m) for m in MACHINES}
    results = {"config": {**{k: v for k, v in vars(args).items() if k != "out"}, "documents": documents,
                          "cores_per_machine": CORES_PER_MACHINE, "tokenizer_threads": 1},
               "samples": samples, **result, "goal_ratio": GOAL_RATIO,
               "environment": environment(rayon_num_threads=os.environ["RAYON_NUM_THREADS"])}
    write_results(args.out, results)
    print(table(results))
    print(f"\nwritten to {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

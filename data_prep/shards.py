"""``prepare --shard I/N``: the I-th of N disjoint parts of a corpus's input files, so that
N machines (or the N tasks of a SLURM array) prepare one corpus and ``prepare merge``
joins their folders (data_prep/merge.py).

A part is a contiguous run of the input files in reading order (every source's files,
the sources in command-line order), cut where the input bytes reach k/N of the total,
and never empty. Concatenated in part order the parts are the input in its own order,
so the merged splits hold the same documents in the same order as one machine's.
Every part records the corpus's fingerprint, a sha256 of the options that shape the
tokens and of the whole file list (paths and sizes): a merge refuses parts whose
fingerprints differ (another corpus, seed or split).
"""

from __future__ import annotations

import argparse
import bisect
import hashlib
import json
import os
import re
from dataclasses import dataclass
from itertools import accumulate

from data_prep.errors import PrepareError
from data_prep.sources.document import Source

_SPEC = re.compile(r"^\s*(\d+)\s*/\s*(\d+)\s*$")


@dataclass(frozen=True)
class ShardSpec:
    index: int  # 1..count
    count: int

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


def parse_shard(value: str) -> ShardSpec:
    """``I/N`` with 1 <= I <= N (argparse's type: a bad value is its one-line error)."""
    match = _SPEC.match(value)
    if match is None or not 1 <= int(match[1]) <= int(match[2]):
        raise argparse.ArgumentTypeError(f"{value!r} is not I/N with 1 <= I <= N (the I-th of N parts, "
                                         "counted from 1, e.g. 3/8)")
    return ShardSpec(int(match[1]), int(match[2]))


def part_bounds(sizes: list[int], count: int) -> list[tuple[int, int]]:
    """[start, end) of each of ``count`` contiguous parts of files of ``sizes`` bytes: cut
    where the bytes before the cut come nearest k/count of the total, every part at
    least one file (needs len(sizes) >= count)."""
    weights = [max(size, 1) for size in sizes]  # an empty file still costs a read
    before = [0, *accumulate(weights)]  # before[j]: bytes of files 0..j-1
    total, files, cuts = before[-1], len(sizes), [0]
    for k in range(1, count):
        target = k * total / count
        cut = bisect.bisect_left(before, target)
        if cut > 0 and target - before[cut - 1] <= before[cut] - target:
            cut -= 1
        cuts.append(min(max(cut, cuts[-1] + 1), files - (count - k)))
    cuts.append(files)
    return list(zip(cuts[:-1], cuts[1:]))


def _file_list(sources: list[Source]) -> list[tuple[int, int, str, int]]:
    """(source number, position in it, path, bytes) of every input file, in reading order."""
    return [(number, position, path, os.path.getsize(path))
            for number, source in enumerate(sources) for position, path in enumerate(source.paths)]


def corpus_fingerprint(sources: list[Source], options: dict) -> str:
    """sha256 of the sources, their whole file list and ``options`` (before any --shard)."""
    content = {"sources": [source.describe() for source in sources],
               "files": [[path, size] for _, _, path, size in _file_list(sources)], "options": options}
    return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()


def keep_part(sources: list[Source], spec: ShardSpec) -> dict:
    """Narrow every source to its files in part ``spec``; returns the part's record."""
    files = _file_list(sources)
    if len(files) < spec.count:
        raise PrepareError(f"--shard {spec}: the input has {len(files)} file(s) and a part is at least one file; "
                           f"use at most {len(files)} parts")
    start, end = part_bounds([size for *_, size in files], spec.count)[spec.index - 1]
    for number, source in enumerate(sources):
        source.keep([position for n, position, *_ in files[start:end] if n == number])
    return {"index": spec.index, "count": spec.count, "files": end - start, "corpus_files": len(files),
            "bytes": sum(size for *_, size in files[start:end])}

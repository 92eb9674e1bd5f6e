"""``--shard I/N``: the spec, the partition of the input files (contiguous, covering, never
an empty part, balanced by bytes) and the corpus fingerprint."""

import argparse
import random

import pytest

from data_prep.errors import PrepareError
from data_prep.shards import ShardSpec, corpus_fingerprint, keep_part, parse_shard, part_bounds
from data_prep.sources.files import FileSource


@pytest.mark.parametrize("value, spec", [("1/1", ShardSpec(1, 1)), ("3/8", ShardSpec(3, 8)),
                                         (" 8 / 8 ", ShardSpec(8, 8))])
def test_good_specs(value, spec):
    assert parse_shard(value) == spec and str(spec) == value.replace(" ", "")


@pytest.mark.parametrize("value", ["3/2", "0/0", "1/0", "0/4", "junk", "2", "1/2/3", "-1/4", "1.5/4", ""])
def test_bad_specs(value):
    with pytest.raises(argparse.ArgumentTypeError, match=r"is not I/N with 1 <= I <= N"):
        parse_shard(value)


@pytest.mark.parametrize("seed", range(20))
def test_parts_are_contiguous_cover_every_file_and_are_never_empty(seed):
    rng = random.Random(seed)
    sizes = [rng.choice([0, 1, 10, 1000, 10**6]) for _ in range(rng.randint(1, 60))]
    count = rng.randint(1, len(sizes))
    bounds = part_bounds(sizes, count)
    assert len(bounds) == count and bounds[0][0] == 0 and bounds[-1][1] == len(sizes)
    assert all(start < end for start, end in bounds)
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))


def test_parts_balance_bytes():
    """Equal files: equal parts; one big file among small ones: a part of its own."""
    assert part_bounds([100] * 12, 4) == [(0, 3), (3, 6), (6, 9), (9, 12)]
    assert part_bounds([10] * 5 + [1000] + [10] * 5, 3) == [(0, 5), (5, 6), (6, 11)]
    sizes = [random.Random(1).randint(1, 100) for _ in range(10_000)]
    shares = [sum(sizes[a:b]) / sum(sizes) for a, b in part_bounds(sizes, 7)]
    assert max(abs(share - 1 / 7) for share in shares) < 0.001


def _folder(tmp_path, count):
    for i in range(count):
        (tmp_path / f"f{i:02d}.txt").write_text(f"file {i} " * (i + 1))
    return str(tmp_path)


def test_keep_part_narrows_each_source_and_records_the_part(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    sources = [FileSource(_folder(tmp_path / "a", 5)), FileSource(_folder(tmp_path / "b", 5))]
    everything = [path for source in sources for path in source.paths]
    parts = []
    for index in (1, 2, 3):
        narrowed = [FileSource(_source.pattern) for _source in sources]
        record = keep_part(narrowed, ShardSpec(index, 3))
        parts.append([path for source in narrowed for path in source.paths])
        assert record["index"] == index and record["count"] == 3 and record["corpus_files"] == 10
        assert record["files"] == len(parts[-1])
    assert [path for part in parts for path in part] == everything  # disjoint, in reading order


def test_more_parts_than_files_is_refused(tmp_path):
    with pytest.raises(PrepareError, match=r"--shard 4/4: the input has 3 file\(s\) .* use at most 3 parts"):
        keep_part([FileSource(_folder(tmp_path, 3))], ShardSpec(4, 4))


def test_the_fingerprint_follows_the_files_and_the_options(tmp_path):
    folder = _folder(tmp_path, 4)
    options = {"seed": 0, "val_fraction": 0.01, "chunk_tokens": 1024}
    first = corpus_fingerprint([FileSource(folder)], options)
    assert corpus_fingerprint([FileSource(folder)], dict(options)) == first
    assert corpus_fingerprint([FileSource(folder)], {**options, "seed": 1}) != first
    (tmp_path / "f01.txt").write_text("a longer text than before")
    assert corpus_fingerprint([FileSource(folder)], options) != first

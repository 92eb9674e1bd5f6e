"""``prepare --shard I/N`` on N "machines", then ``prepare merge``: the merged splits hold the
same tokens, documents and order as one machine's prepare of the whole input (the chunk
files differ where the parts end), litdata streams the merged folder, and every bad merge
is refused in one line with nothing written."""

import json
import os
import shutil

import datasets
import numpy as np
import pytest
import zstandard

from data_prep.chunks import read_split_tokens
from data_prep.merge import main as merge_main
from data_prep.prepare import main as prepare_main
from framework.files.manifest import read_manifest
from tests.helpers.in_process import run_main
from tests.helpers.refusals import hashes, refused

OPTIONS = ["--val-fraction", "0.2", "--chunk-tokens", "2048", "--workers", "1", "--no-progress"]


def _prepare(*argv) -> None:
    assert prepare_main([*OPTIONS, *argv]) == 0  # argv last: its options win


@pytest.fixture(scope="module")
def corpus(code_corpus, tmp_path_factory) -> list[str]:
    """Three sources of 3-40 files each: code files, .jsonl.zst shards, a save_to_disk folder."""
    root = tmp_path_factory.mktemp("corpus")
    texts = sorted(os.listdir(code_corpus))
    for shard in range(3):
        lines = [json.dumps({"text": f"record {shard}-{i}: " + "the quick brown fox " * (i % 9 + 1)})
                 for i in range(60)]
        (root / f"web-{shard}.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress("\n".join(lines).encode()))
    datasets.Dataset.from_dict({"text": [f"row {i}\n" + "def f(x):\n    return x\n" * (i % 7) for i in range(120)]}) \
        .save_to_disk(str(root / "saved"), num_shards=3)
    assert len(texts) > 20
    return ["--files", code_corpus, "--jsonl", str(root / "web-*.jsonl.zst"), "--hf-dataset", str(root / "saved")]


@pytest.fixture(scope="module")
def runs(corpus, prepared, tmp_path_factory):
    """One machine's folder, four parts and their merge, with one given tokenizer."""
    root = tmp_path_factory.mktemp("runs")
    _prepare(*corpus, "--tokenizer", prepared, "--out", str(root / "one"))
    for index in range(1, 5):
        _prepare(*corpus, "--tokenizer", prepared, "--shard", f"{index}/4", "--out", str(root / f"part{index}"))
    parts = [str(root / f"part{i}") for i in (3, 1, 4, 2)]  # any order
    assert merge_main([*parts, "--out", str(root / "merged")]) == 0
    return root


def test_merged_splits_hold_one_machines_tokens_in_its_order(runs):
    one, merged = read_manifest(runs / "one"), read_manifest(runs / "merged")
    for split in ("train", "val"):
        single = read_split_tokens(str(runs / "one" / split), "uint16")
        joined = read_split_tokens(str(runs / "merged" / split), "uint16")
        assert np.array_equal(single, joined) and len(single) > 10_000
        assert merged["splits"][split]["documents"] == one["splits"][split]["documents"]
        assert merged["splits"][split]["tokens"] == one["splits"][split]["tokens"]
    assert merged["tokenizer"] == one["tokenizer"]
    assert [s["read"] for s in merged["sources"]] == [s["read"] for s in one["sources"]]
    assert [s["kind"] for s in merged["sources"]] == ["files", "jsonl", "hf_dataset"]
    assert merged["merged"]["count"] == 4 and "--shard 1/4" in merged["merged"]["parts"][0]
    # every part is one contiguous run of the files, and the four cover them
    shards = [read_manifest(runs / f"part{i}")["shard"] for i in range(1, 5)]
    assert sum(s["files"] for s in shards) == shards[0]["corpus_files"] and all(s["files"] for s in shards)
    assert len({s["corpus_sha256"] for s in shards}) == 1


def test_the_chunk_files_differ_only_where_parts_end(runs):
    """Not byte-identical to one machine's: each part's last chunk of a split is short."""
    index = json.loads((runs / "merged" / "train" / "index.json").read_text())
    short = [c["dim"] for c in index["chunks"] if c["dim"] < 2048]
    parts_with_train = sum(1 for i in range(1, 5) if read_manifest(runs / f"part{i}")["splits"]["train"]["chunks"])
    assert len(short) == parts_with_train
    assert len(index["chunks"]) >= read_manifest(runs / "one")["splits"]["train"]["chunks"]


def test_litdata_streams_the_merged_folder(runs):
    """Every block TokensLoader yields, in order: each chunk's tokens less its tail."""
    from litdata import StreamingDataset, TokensLoader

    block = 256
    dataset = StreamingDataset(str(runs / "merged" / "train"), item_loader=TokensLoader(block_size=block),
                               shuffle=False)
    streamed = np.concatenate([np.asarray(item) for item in dataset])
    index = json.loads((runs / "merged" / "train" / "index.json").read_text())
    tokens, expected, offset = read_split_tokens(str(runs / "merged" / "train"), "uint16"), [], 0
    for chunk in index["chunks"]:
        expected.append(tokens[offset:offset + chunk["dim"] // block * block])
        offset += chunk["dim"]
    assert np.array_equal(streamed, np.concatenate(expected))


def test_a_merged_folder_is_a_prepared_folder(runs, tmp_path, capsys):
    """It trains (the data module reads it) and gives its tokenizer to the next source."""
    from framework.training.data import TokenDataModule

    module = TokenDataModule(str(runs / "merged"), seq_len=64, batch_size=4, model_vocab_size=300)
    module.setup("fit")
    inputs, _ = next(iter(module.train_dataloader()))
    assert inputs.shape == (4, 64)


# -- refusals: one line, exit 2, nothing written ----------------------------------------------


def _refused_in_process(argv, capsys) -> str:
    code, printed = run_main(merge_main, argv, capsys)
    lines = printed.err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), printed.err
    return lines[0]


@pytest.fixture(scope="module")
def odd_parts(corpus, prepared, runs, tmp_path_factory):
    """Parts that do not belong with runs/part1..4."""
    from tests.helpers.hf_tokenizer import no_bos_tokenizer

    root = tmp_path_factory.mktemp("odd")
    no_bos_tokenizer(root / "other.json")
    _prepare(*corpus, "--tokenizer", str(root / "other.json"), "--shard", "4/4", "--out", str(root / "other_tokenizer"))
    _prepare(*corpus, "--tokenizer", prepared, "--shard", "2/2", "--out", str(root / "of_two"))
    _prepare(*corpus, "--tokenizer", prepared, "--shard", "4/4", "--seed", "1", "--out", str(root / "other_seed"))
    shutil.copytree(runs / "part2", root / "copy_of_2")
    shutil.copytree(runs / "part3", root / "incomplete")
    chunk = sorted((root / "incomplete" / "train").glob("*.bin"))[0]
    chunk.unlink()
    (root / "stranger").mkdir()
    return root


@pytest.mark.parametrize("case, message", [
    ("twice", "is given twice (overlapping parts)"),
    ("same index", "are both part 2/4 (overlapping parts)"),
    ("other count", "come from different shard counts"),
    ("other tokenizer", "was prepared with another tokenizer than"),
    ("other seed", "was prepared from other inputs or options than"),
    ("missing", "part(s) 4 of 4 missing: give all 4 parts"),
    ("whole folder", "was prepared without --shard: it is not a part"),
    ("no manifest", "has no manifest.json: not a folder made by layerdrop prepare --shard"),
    ("incomplete", "the train split is incomplete"),
])
def test_bad_merges_are_refused(case, message, runs, odd_parts, tmp_path, capsys):
    parts = [str(runs / f"part{i}") for i in range(1, 5)]
    argv = {"twice": [*parts, parts[0]],
            "same index": [*parts, str(odd_parts / "copy_of_2")],
            "other count": [*parts[:3], str(odd_parts / "of_two")],
            "other tokenizer": [*parts[:3], str(odd_parts / "other_tokenizer")],
            "other seed": [*parts[:3], str(odd_parts / "other_seed")],
            "missing": parts[:3],
            "whole folder": [*parts, str(runs / "one")],
            "no manifest": [*parts, str(odd_parts / "stranger")],
            "incomplete": [*parts[:2], str(odd_parts / "incomplete"), parts[3]]}[case]
    before = hashes(runs, odd_parts)
    line = _refused_in_process([*argv, "--out", str(tmp_path / "out")], capsys)
    assert message in line and line.endswith("see layerdrop prepare merge --help")
    assert hashes(runs, odd_parts) == before and os.listdir(tmp_path) == []


def test_a_part_with_another_tokenizer_is_refused_by_the_command(runs, odd_parts, tmp_path):
    """As a user runs it: `layerdrop prepare merge` in a subprocess, one line, status 2."""
    before = hashes(runs, odd_parts)
    line = refused("prepare", "merge", *[str(runs / f"part{i}") for i in range(1, 4)],
                   str(odd_parts / "other_tokenizer"), "--out", str(tmp_path / "out"))
    assert "part 4/4) was prepared with another tokenizer than" in line and "(sha256 " in line
    assert hashes(runs, odd_parts) == before and os.listdir(tmp_path) == []


def test_parts_without_a_val_document_are_refused(corpus, prepared, tmp_path, capsys):
    """A tiny val fraction that puts no document in val anywhere: one machine would move
    one there; parts cannot agree on which, so the merge refuses."""
    for index in (1, 2):
        _prepare(*corpus, "--tokenizer", prepared, "--shard", f"{index}/2", "--val-fraction", "1e-9",
                 "--out", str(tmp_path / f"p{index}"))
    assert read_manifest(tmp_path / "p1")["splits"]["val"] == {"path": "val", "documents": 0, "tokens": 0,
                                                                  "chunks": 0}
    assert not (tmp_path / "p1" / "val").exists()
    line = _refused_in_process([str(tmp_path / "p1"), str(tmp_path / "p2"), "--out", str(tmp_path / "out")], capsys)
    assert "no part has a document in the val split" in line and not (tmp_path / "out").exists()


def test_existing_output_is_kept(runs, tmp_path, capsys):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "mine.txt").write_text("keep")
    line = _refused_in_process([*[str(runs / f"part{i}") for i in range(1, 5)], "--out", str(tmp_path / "out")], capsys)
    assert "already holds data" in line and os.listdir(tmp_path / "out") == ["mine.txt"]


def test_one_part_of_one_merges_to_one_machines_folder(corpus, prepared, runs, tmp_path, capsys):
    """--shard 1/1 then merge (litdata merges two or more; one is copied): the same tokens."""
    _prepare(*corpus, "--tokenizer", prepared, "--shard", "1/1", "--out", str(tmp_path / "only"))
    code, printed = run_main(merge_main, [str(tmp_path / "only"), "--out", str(tmp_path / "merged")], capsys)
    assert code == 0 and printed.out.startswith("merged 1 parts into")
    for split in ("train", "val"):
        assert np.array_equal(read_split_tokens(str(tmp_path / "merged" / split), "uint16"),
                              read_split_tokens(str(runs / "one" / split), "uint16"))
    assert sorted(os.listdir(tmp_path)) == ["merged", "only"]

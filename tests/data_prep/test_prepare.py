"""`layerdrop prepare` end to end on small real corpora, its output and its errors."""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

from data_prep.chunks import read_split_tokens
from framework.files.manifest import read_manifest
from data_prep.split import VAL, split_key, split_of
from data_prep.trained_tokenizer import train_tokenizer
from tests.helpers.refusals import hashes, refused

SMALL = ["--vocab-size", "400", "--val-fraction", "0.2", "--chunk-tokens", "8192", "--workers", "2"]


def error_line(stderr: str) -> str:
    """The one error line ("error: ...; see layerdrop prepare --help") of a failed run."""
    lines = [line for line in stderr.splitlines() if "error:" in line]
    assert len(lines) == 1, stderr
    return lines[0]


def _folder_bytes(folder) -> dict[str, bytes]:
    found = {}
    for root, _, files in os.walk(folder):
        for name in files:
            path = os.path.join(root, name)
            found[os.path.relpath(path, folder)] = open(path, "rb").read()
    return found


def _docs_by_split(folder, tokens_split):
    """The split's token stream cut at EOS into documents."""
    manifest = read_manifest(folder)
    tokens = read_split_tokens(os.path.join(folder, tokens_split), manifest["dtype"])
    eos = manifest["tokenizer"]["eos_id"]
    cuts = np.flatnonzero(tokens == eos)
    starts = np.concatenate([[0], cuts[:-1] + 1])
    return [tokens[s:e] for s, e in zip(starts, cuts)], tokens


@pytest.fixture(scope="module")
def small(code_corpus, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("small") / "data")
    from data_prep.prepare import main

    assert main(["--files", code_corpus, "--out", out, "--no-progress", *SMALL]) == 0
    return out


def test_output_folder_layout(small):
    assert sorted(os.listdir(small)) == ["manifest.json", "tokenizer.json", "train", "val"]
    for split in ("train", "val"):
        files = os.listdir(os.path.join(small, split))
        assert "index.json" in files and all(f == "index.json" or f.endswith(".bin") for f in files)


def test_manifest_records_everything(small, code_corpus):
    manifest = read_manifest(small)
    files = sorted(os.listdir(code_corpus))
    assert manifest["format"] == "layerdrop-tokens/1"
    assert manifest["command"].startswith(f"layerdrop prepare --files {code_corpus} --out {small}")
    assert manifest["dtype"] == "uint16" and manifest["chunk_tokens"] == 8192
    tokenizer = manifest["tokenizer"]
    assert (tokenizer["vocab_size"], tokenizer["eos_token"], tokenizer["eos_id"]) == (400, "<|endoftext|>", 0)
    assert tokenizer["origin"] == "trained"
    import hashlib

    assert tokenizer["sha256"] == hashlib.sha256(open(os.path.join(small, "tokenizer.json"), "rb").read()).hexdigest()
    (source,) = manifest["sources"]
    assert source["kind"] == "files" and source["files"] == len(files) == source["read"]["documents"]
    assert source["read"]["invalid_utf8"] == manifest["invalid_utf8_documents"] == 0
    splits = manifest["splits"]
    assert splits["train"]["documents"] + splits["val"]["documents"] == len(files)
    for name, split in splits.items():
        tokens = read_split_tokens(os.path.join(small, name), "uint16")
        assert split["tokens"] == len(tokens) and split["chunks"] == -(-len(tokens) // 8192)


def test_round_trip_and_split_by_hash(small, code_corpus):
    """Decoding each split's documents gives back exactly the files the hash put there."""
    tokenizer = Tokenizer.from_file(os.path.join(small, "tokenizer.json"))
    texts = [open(os.path.join(code_corpus, f), encoding="utf-8").read() for f in sorted(os.listdir(code_corpus))]
    for split_index, split in enumerate(("train", "val")):
        docs, _ = _docs_by_split(small, split)
        expected = [text for text in texts if split_of(split_key(text, 0), 0.2) == split_index]
        assert [tokenizer.decode(doc.tolist()) for doc in docs] == expected
    assert VAL == 1


def test_same_inputs_and_seed_give_identical_bytes(small, code_corpus, tmp_path, prepare):
    """A second run into the same --out path (after moving the first away) is byte-identical."""
    moved = tmp_path / "first"
    out = os.path.join(tmp_path, "data")
    argv = ["--files", code_corpus, "--out", out, "--max-tokens", "60k", *SMALL]
    assert prepare(*argv)[0] == 0
    shutil.move(out, moved)
    assert prepare(*argv)[0] == 0
    assert _folder_bytes(out) == _folder_bytes(moved)
    assert prepare(*argv, "--seed", "5", "--overwrite")[0] == 0
    assert _folder_bytes(out)["val/index.json"] != _folder_bytes(moved)["val/index.json"]


def test_given_tokenizer_is_copied_verbatim_and_its_eos_found(code_corpus, tmp_path, prepare):
    texts = [open(os.path.join(code_corpus, f), encoding="utf-8").read() for f in sorted(os.listdir(code_corpus))]
    path = str(tmp_path / "mine.json")
    train_tokenizer(texts, 300, eos_token="</s>").save(path)
    out = str(tmp_path / "data")
    code, _ = prepare("--files", code_corpus, "--tokenizer", path, "--out", out, "--max-tokens", "20k")
    assert code == 0
    manifest = read_manifest(out)
    assert open(os.path.join(out, "tokenizer.json"), "rb").read() == open(path, "rb").read()
    assert manifest["tokenizer"]["eos_token"] == "</s>" and manifest["tokenizer"]["origin"] == os.path.abspath(path)
    assert sum(split["tokens"] for split in manifest["splits"].values()) == 20_000


def test_large_vocabulary_is_stored_as_uint32(tmp_path, prepare):
    """A word-level tokenizer whose ids pass 65,535 (like Llama-3's 128,256) keeps them exact."""
    words = [f"w{i}" for i in range(70_000)]
    vocab = {"[UNK]": 0, "<|end_of_text|>": 1, **{word: i + 2 for i, word in enumerate(words)}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer_path = str(tmp_path / "big.json")
    tokenizer.save(tokenizer_path)
    lines = [{"text": " ".join(words[(i * 7919) % 69_000 + j] for j in range(50))} for i in range(40)]
    (tmp_path / "docs.jsonl").write_text("\n".join(json.dumps(line) for line in lines))
    out = str(tmp_path / "data")
    assert prepare("--jsonl", str(tmp_path / "docs.jsonl"), "--tokenizer", tokenizer_path, "--out", out)[0] == 0
    manifest = read_manifest(out)
    assert manifest["dtype"] == "uint32" and manifest["tokenizer"]["vocab_size"] == 70_002
    assert manifest["tokenizer"]["eos_id"] == 1
    docs = _docs_by_split(out, "train")[0] + _docs_by_split(out, "val")[0]
    expected = {tuple(tokenizer.encode(line["text"]).ids) for line in lines}
    assert {tuple(doc.tolist()) for doc in docs} == expected
    assert max(max(doc) for doc in docs) > 65_535


def test_jsonl_and_parquet_sources_combine_in_order(tmp_path, prepare):
    import pyarrow as pa
    import pyarrow.parquet as pq

    jsonl_texts = [f"record {i}: the quick brown fox {i * i} jumps" for i in range(30)]
    parquet_texts = [f"row {i}\n  def f(x):\n      return x ** {i}\n" for i in range(30)]
    (tmp_path / "a.jsonl").write_text("\n".join(json.dumps({"body": text}) for text in jsonl_texts))
    pq.write_table(pa.table({"code": parquet_texts}), tmp_path / "b.parquet")
    out = str(tmp_path / "data")
    code, _ = prepare("--jsonl", str(tmp_path / "a.jsonl"), "--text-field", "body", "--parquet",
                      str(tmp_path / "b.parquet"), "--text-column", "code", "--vocab-size", "300", "--out", out)
    assert code == 0
    tokenizer = Tokenizer.from_file(os.path.join(out, "tokenizer.json"))
    decoded = [tokenizer.decode(doc.tolist()) for split in ("train", "val") for doc in _docs_by_split(out, split)[0]]
    assert sorted(decoded) == sorted(jsonl_texts + parquet_texts)
    train = [tokenizer.decode(doc.tolist()) for doc in _docs_by_split(out, "train")[0]]
    everything = jsonl_texts + parquet_texts
    assert train == [text for text in everything if text in train]  # corpus order within a split
    kinds = [source["kind"] for source in read_manifest(out)["sources"]]
    assert kinds == ["jsonl", "parquet"]


# -- bad input: one line, exit 2, nothing touched ------------------------------------


def _bad_inputs(tmp_path, code_corpus):
    import datasets
    import zstandard

    from tests.helpers.hf_tokenizer import no_bos_tokenizer

    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "blank.txt").write_text("\n\n")
    (tmp_path / "empty" / "blob.bin").write_bytes(b"\x00\x01")
    (tmp_path / "rows.jsonl").write_text('{"text": "fine"}\n{"content": "no text field"}\n')
    (tmp_path / "broken.json").write_text("{ this is not a tokenizer")
    whole = zstandard.ZstdCompressor().compress(("\n".join(json.dumps({"text": f"doc {i} " * 50}) for i in range(2000))
                                                 ).encode())
    (tmp_path / "cut.jsonl.zst").write_bytes(whole[:len(whole) // 2])
    (tmp_path / "plain.jsonl.zst").write_text('{"text": "not compressed"}\n')
    (tmp_path / "deep.jsonl").write_text('{"text": "fine"}\n' + "[" * 20_000 + "\n")
    datasets.Dataset.from_dict({"body": ["a", "b"], "n": [1, 2]}).save_to_disk(str(tmp_path / "saved"))
    no_bos_tokenizer(tmp_path / "tok.json")
    tok = ["--tokenizer", str(tmp_path / "tok.json")]
    return {
        "missing path": (["--files", str(tmp_path / "nowhere")], "no such file or folder"),
        "empty glob": (["--files", str(tmp_path / "*.xyz")], "the glob matches no files"),
        "empty corpus": (["--files", str(tmp_path / "empty")], "the corpus is empty after filtering"),
        "jsonl without the field": (["--jsonl", str(tmp_path / "rows.jsonl")], "line 2 has no field 'text'"),
        "unreadable tokenizer": (["--files", code_corpus, "--tokenizer", str(tmp_path / "broken.json")],
                                 "not a readable tokenizer.json"),
        "missing tokenizer": (["--files", code_corpus, "--tokenizer", str(tmp_path / "none.json")],
                              "no such file"),
        "vocab size not a number": (["--files", code_corpus, "--vocab-size", "many"], "'many' is not a positive"),
        "vocab size zero": (["--files", code_corpus, "--vocab-size", "0"], "'0' is not a positive integer"),
        "vocab size negative": (["--files", code_corpus, "--vocab-size", "-5"], "'-5' is not a positive integer"),
        "vocab size below bytes": (["--files", code_corpus, "--vocab-size", "100"], "at least 257"),
        "no corpus": ([], "no corpus given"),
        "val fraction": (["--files", code_corpus, "--val-fraction", "1.5"], "strictly between 0 and 1"),
        "truncated zst": (["--jsonl", str(tmp_path / "cut.jsonl.zst")],
                          "cut.jsonl.zst': not a complete zstandard stream (it ends inside a zstandard frame"),
        "zst that is not zstd": (["--jsonl", str(tmp_path / "plain.jsonl.zst")],
                                 "not a complete zstandard stream (zstd decompressor error: Unknown frame descriptor)"),
        "nested thousands deep": (["--jsonl", str(tmp_path / "deep.jsonl")],
                                  "deep.jsonl line 2 nests arrays or objects deeper than the JSON reader allows"),
        "datasets folder without the column": (["--hf-dataset", str(tmp_path / "saved")],
                                               "data-00000-of-00001.arrow has no column 'text' (it has: body, n)"),
        "non-string column": (["--hf-dataset", str(tmp_path / "saved"), "--text-column", "n"],
                              "column 'n' is int64, not a string column"),
        "shard 3/2": (["--files", code_corpus, *tok, "--shard", "3/2"], "argument --shard: '3/2' is not I/N"),
        "shard 0/0": (["--files", code_corpus, *tok, "--shard", "0/0"], "'0/0' is not I/N with 1 <= I <= N"),
        "shard 1/0": (["--files", code_corpus, *tok, "--shard", "1/0"], "'1/0' is not I/N"),
        "shard junk": (["--files", code_corpus, *tok, "--shard", "half"], "'half' is not I/N"),
        "shard with more parts than files": (["--files", code_corpus, *tok, "--shard", "1/500"],
                                             "use at most"),
        "shard with a trained tokenizer": (["--files", code_corpus, "--shard", "1/2"],
                                           "--shard 1/2 needs a given --tokenizer"),
        "shard with a token cap": (["--files", code_corpus, *tok, "--shard", "1/2", "--max-tokens", "1M"],
                                   "--max-tokens caps one prepare, not a corpus of --shard 1/2 parts"),
    }


@pytest.mark.parametrize("case", ["missing path", "empty glob", "empty corpus", "jsonl without the field",
                                  "unreadable tokenizer", "missing tokenizer", "vocab size not a number",
                                  "vocab size zero", "vocab size negative", "vocab size below bytes",
                                  "no corpus", "val fraction", "truncated zst", "zst that is not zstd",
                                  "nested thousands deep", "datasets folder without the column", "non-string column",
                                  "shard 3/2", "shard 0/0", "shard 1/0", "shard junk",
                                  "shard with more parts than files", "shard with a trained tokenizer",
                                  "shard with a token cap"])
def test_bad_input_is_one_line_and_exit_2(case, tmp_path, code_corpus, prepare):
    argv, message = _bad_inputs(tmp_path, code_corpus)[case]
    out = tmp_path / "out"
    code, stderr = prepare(*argv, "--out", str(out))
    assert code == 2
    assert message in error_line(stderr)
    assert "Traceback" not in stderr
    assert case == "empty corpus" or "training" not in stderr  # found before the tokenizer is trained
    assert not out.exists() and not [p for p in os.listdir(tmp_path) if p.startswith(".out")]


def test_existing_data_is_refused_and_kept(tmp_path, code_corpus, prepare):
    out = tmp_path / "out"
    out.mkdir()
    (out / "precious.bin").write_text("keep me")
    code, stderr = prepare("--files", code_corpus, "--out", str(out))
    assert code == 2 and "already holds data" in error_line(stderr) and "--overwrite" in stderr
    assert os.listdir(out) == ["precious.bin"]


def test_failed_overwrite_keeps_the_old_data(tmp_path, code_corpus, small, prepare):
    """--overwrite only replaces the folder once the new data is complete."""
    out = shutil.copytree(small, tmp_path / "out")
    before = hashes(out)
    (tmp_path / "rows.jsonl").write_text('{"text": "fine"}\n' * 50 + '{"body": "late bad line"}\n')
    code, stderr = prepare("--jsonl", str(tmp_path / "rows.jsonl"), "--files", code_corpus,
                           "--out", str(out), "--overwrite", "--vocab-size", "300")
    assert code == 2 and "line 51 has no field 'text'" in error_line(stderr)
    assert hashes(out) == before
    assert sorted(os.listdir(tmp_path)) == ["out", "rows.jsonl"]


def test_a_bad_record_deep_in_a_big_jsonl_fails_before_the_tokenizer_is_trained(tmp_path, prepare, monkeypatch):
    import data_prep.trained_tokenizer

    def never(*args, **kwargs):
        raise AssertionError("the tokenizer was trained before every record was checked")

    monkeypatch.setattr(data_prep.trained_tokenizer, "train_tokenizer", never)
    rows = tmp_path / "big.jsonl"
    rows.write_text((json.dumps({"text": "def f(x):\n    return x * 2\n" * 20}) + "\n") * 20_000 +
                    json.dumps({"body": "no text field here"}) + "\n")
    code, stderr = prepare("--jsonl", str(rows), "--max-tokens", "10k", "--out", str(tmp_path / "out"))
    assert code == 2 and f"{rows} line 20001 has no field 'text' (it has: body)" in error_line(stderr)
    assert "training" not in stderr
    assert sorted(os.listdir(tmp_path)) == ["big.jsonl"]


def test_a_killed_run_leaves_nothing_the_next_run_does_not_clean(tmp_path, code_corpus):
    """kill -9 while the staging folder is being written, then run again."""
    import signal
    import time

    out = tmp_path / "out"
    command = [sys.executable, "-m", "framework.cli", "prepare", "--files", code_corpus, "--out", str(out),
               "--vocab-size", "300", "--workers", "1", "--no-progress"]
    killed = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not any(p.startswith(".out.staging-") for p in os.listdir(tmp_path)) and killed.poll() is None:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    assert [p for p in os.listdir(tmp_path) if p.startswith(".out.staging-")]  # what a kill leaves
    result = subprocess.run(command, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "removed 1 staging folder(s) of killed runs" in result.stderr
    assert sorted(os.listdir(tmp_path)) == ["out"]


def test_overwrite_replaces_old_data(tmp_path, code_corpus, small, prepare):
    out = shutil.copytree(small, tmp_path / "out")
    (out / "old.bin").write_text("old")  # beside the manifest: part of the prepared folder
    assert prepare("--files", code_corpus, "--out", str(out), "--overwrite", "--max-tokens", "5k",
                   "--vocab-size", "300")[0] == 0
    assert sorted(os.listdir(out)) == ["manifest.json", "tokenizer.json", "train", "val"]


def test_vocab_size_with_a_given_tokenizer_is_refused(tmp_path, code_corpus, small, prepare):
    code, stderr = prepare("--files", code_corpus, "--tokenizer", os.path.join(small, "tokenizer.json"),
                           "--vocab-size", "300", "--out", str(tmp_path / "out"))
    assert code == 2 and "--vocab-size applies to --tokenizer train only" in error_line(stderr)


def test_console_command_reports_errors(tmp_path):
    """Through the real `layerdrop` entry point: one error line (no usage block), status 2."""
    result = subprocess.run([sys.executable, "-m", "framework.cli", "prepare", "--files", str(tmp_path / "x"),
                             "--out", str(tmp_path / "o")], capture_output=True, text=True)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"error: --files '{tmp_path / 'x'}': no such file or folder; see layerdrop prepare --help"]


# -- the built-in corpus ---------------------------------------------------------------


@pytest.fixture(scope="module")
def builtin_small(tmp_path_factory):
    from data_prep.prepare import main

    out = str(tmp_path_factory.mktemp("builtin") / "data")
    assert main(["--corpus", "builtin", "--max-tokens", "200k", "--vocab-size", "512", "--out", out,
                 "--no-progress"]) == 0
    return out


def test_builtin_corpus_capped(builtin_small):
    manifest = read_manifest(builtin_small)
    splits = manifest["splits"]
    assert splits["train"]["tokens"] + splits["val"]["tokens"] == 200_000
    assert splits["val"]["documents"] >= 1 and manifest["truncated_last_document"] in (True, False)
    (source,) = manifest["sources"]
    assert source["kind"] == "builtin" and source["stdlib_files"] > 500
    # "read" counts what was read; under a cap the last encoding batch is read whole
    assert source["read"]["documents"] >= splits["train"]["documents"] + splits["val"]["documents"]
    assert "invalid_utf8" in source["read"] and manifest["tokenizer"]["vocab_size"] == 512
    docs, _ = _docs_by_split(builtin_small, "train")
    tokenizer = Tokenizer.from_file(os.path.join(builtin_small, "tokenizer.json"))
    texts = [tokenizer.decode(doc.tolist()) for doc in docs[:-1]]
    assert any("def " in text for text in texts)  # code
    assert any("NAME\n" in text for text in texts)  # a rendered man page


@pytest.mark.slow
def test_tiny_recipe_data_through_the_console_command(tmp_path):
    """recipes/tiny.yaml's prepare command as a user runs it (~20 CPU-seconds), then streamed."""
    out = str(tmp_path / "data")
    result = subprocess.run([sys.executable, "-m", "framework.cli", "prepare", "--corpus", "builtin",
                             "--tokenizer", "train", "--vocab-size", "8192", "--max-tokens", "3M", "--out", out],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    manifest = read_manifest(out)
    assert sum(split["tokens"] for split in manifest["splits"].values()) == 3_000_000
    assert manifest["tokenizer"]["vocab_size"] == 8192 and manifest["dtype"] == "uint16"
    from framework.training.data import TokenDataModule

    module = TokenDataModule(out, seq_len=128, batch_size=8, model_vocab_size=8192)
    module.setup("fit")
    inputs, targets = next(iter(module.train_dataloader()))
    assert inputs.shape == (8, 128) and int(inputs.max()) < 8192


# -- what --overwrite may replace: prepared data, nothing else ----------------------------


def test_overwrite_refuses_an_output_that_holds_an_input(small, code_corpus, tmp_path):
    corpus = shutil.copytree(code_corpus, tmp_path / "corpus")
    data = shutil.copytree(small, tmp_path / "data")
    before = hashes(corpus, data)
    line = refused("prepare", "--files", str(corpus), "--out", str(corpus), "--overwrite")
    assert f"--out {str(corpus)!r} holds the input --files" in line
    line = refused("prepare", "--files", str(corpus), "--tokenizer", str(data / "tokenizer.json"),
                   "--out", str(data), "--overwrite")
    assert f"holds the input --tokenizer {str(data / 'tokenizer.json')!r}" in line
    assert hashes(corpus, data) == before


@pytest.mark.parametrize("out", [".", "..", "{cwd}"])
def test_overwrite_refuses_the_working_directory_and_above(out, code_corpus, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    (work / "notes.txt").write_text("mine")
    before = hashes(tmp_path)
    out = out.format(cwd=work)
    line = refused("prepare", "--files", code_corpus, "--out", out, "--overwrite", cwd=work)
    assert f"--out {out!r} is the working directory or holds it" in line
    assert hashes(tmp_path) == before


def test_overwrite_refuses_a_folder_that_is_not_prepared_data(code_corpus, tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "thesis.tex").write_text("years of work")
    before = hashes(tmp_path)
    line = refused("prepare", "--files", code_corpus, "--out", str(tmp_path / "mine"), "--overwrite")
    assert "holds 1 entries but no manifest.json: it is not data made by layerdrop prepare" in line
    assert hashes(tmp_path) == before


def test_a_tokenizer_with_a_bos_starts_every_document_with_it(code_corpus, tmp_path, prepare):
    """Llama 3's tokenizer adds <|begin_of_text|>: each document is BOS + text + EOS, as
    Hugging Face's tok(text) starts it; --document-start eos keeps the EOS separator alone."""
    from tests.helpers.hf_tokenizer import llama3_tokenizer

    path = tmp_path / "llama3.json"
    tokenizer = llama3_tokenizer(path)
    out = str(tmp_path / "data")
    assert prepare("--files", code_corpus, "--tokenizer", str(path), "--out", out, "--val-fraction", "0.2")[0] == 0
    entry = read_manifest(out)["tokenizer"]
    assert (entry["document_start"], entry["bos_token"], entry["bos_id"]) == ("bos", "<|begin_of_text|>", 0)
    assert (entry["eos_token"], entry["eos_id"]) == ("<|end_of_text|>", 1)
    docs, tokens = _docs_by_split(out, "train")
    assert len(docs) > 3 and all(doc[0] == 0 and (doc[1:] != 0).all() for doc in docs)
    texts = {open(os.path.join(code_corpus, f), encoding="utf-8").read() for f in os.listdir(code_corpus)}
    assert {tokenizer.decode(doc[1:].tolist()) for doc in docs} <= texts

    plain = str(tmp_path / "plain")
    assert prepare("--files", code_corpus, "--tokenizer", str(path), "--out", plain, "--val-fraction", "0.2",
                   "--document-start", "eos")[0] == 0
    assert read_manifest(plain)["tokenizer"]["document_start"] == "eos"
    docs, _ = _docs_by_split(plain, "train")
    assert not any(doc[0] == 0 for doc in docs)


def test_the_trained_tokenizer_records_the_eos_start_and_refuses_bos(small, code_corpus, tmp_path, prepare):
    entry = read_manifest(small)["tokenizer"]
    assert entry["document_start"] == "eos" and "bos_id" not in entry
    code, stderr = prepare("--files", code_corpus, "--document-start", "bos", "--out", str(tmp_path / "out"))
    assert code == 2 and "--document-start bos needs a tokenizer that adds a BOS" in error_line(stderr)
    path = tmp_path / "gpt2.json"
    from tests.helpers.hf_tokenizer import no_bos_tokenizer

    no_bos_tokenizer(path)
    code, stderr = prepare("--files", code_corpus, "--tokenizer", str(path), "--document-start", "bos",
                           "--out", str(tmp_path / "out"))
    assert code == 2 and "adds no BOS" in error_line(stderr)


# -- the builtin corpus as two sources of one mixture ------------------------------------------


HALF = ["--max-tokens", "60k", "--vocab-size", "300"]


@pytest.fixture(scope="module")
def halves(tmp_path_factory):
    from data_prep.prepare import main

    root = tmp_path_factory.mktemp("halves")
    for corpus in ("builtin:code", "builtin:prose", "builtin"):
        name = corpus.replace(":", "-")
        assert main(["--corpus", corpus, *HALF, "--out", str(root / name), "--no-progress"]) == 0
    return root


def test_each_half_holds_its_own_documents_in_the_whole_corpus_order(halves):
    from data_prep.builtin_corpus import BuiltinSource
    from data_prep.sources.document import SourceStats

    for half, kind in (("builtin-code", "stdlib"), ("builtin-prose", "man")):
        (source,) = read_manifest(halves / half)["sources"]
        assert source["corpus"] == half.replace("-", ":") and source["kind"] == "builtin"
        assert (source["stdlib_files"] > 500) == (kind == "stdlib") and (source["man_pages"] > 0) == (kind == "man")
        tokenizer = Tokenizer.from_file(str(halves / half / "tokenizer.json"))
        docs = _docs_by_split(halves / half, "train")[0] + _docs_by_split(halves / half, "val")[0]
        texts = {tokenizer.decode(doc.tolist()) for doc in docs[:-1]}  # the last one may be cut by the cap
        whole = BuiltinSource()
        wanted = [doc.text for doc, file in zip(whole.documents(SourceStats()), whole.files) if file.kind == kind]
        assert texts <= set(wanted[:len(docs) + 5]) and len(texts) > 3


def test_the_halves_share_the_whole_corpus_tokenizer(halves):
    """Trained for a half, the tokenizer learns the whole builtin corpus: both halves (and
    --corpus builtin with the same options) get the same file, so one mixture takes both."""
    files = {half: (halves / half / "tokenizer.json").read_bytes() for half in ("builtin-code", "builtin-prose",
                                                                                 "builtin")}
    assert len(set(files.values())) == 1
    entries = [read_manifest(halves / half)["tokenizer"] for half in ("builtin-code", "builtin-prose")]
    assert entries[0] == entries[1] and entries[0]["trained_on"]["corpus"] == "builtin"
    assert entries[0]["document_start"] == "eos" and entries[0]["eos_id"] == 0
    assert "corpus" not in read_manifest(halves / "builtin")["tokenizer"]["trained_on"]


def test_the_second_half_takes_the_first_halfs_folder_as_its_tokenizer(halves, tmp_path, prepare):
    """Different caps train different tokenizers: --tokenizer FOLDER makes the second half
    use the first's, with its recorded EOS and document start."""
    out = tmp_path / "prose"
    assert prepare("--corpus", "builtin:prose", "--max-tokens", "30k", "--tokenizer", str(halves / "builtin-code"),
                   "--out", str(out))[0] == 0
    mine, first = read_manifest(out)["tokenizer"], read_manifest(halves / "builtin-code")["tokenizer"]
    assert {k: mine[k] for k in ("sha256", "eos_id", "document_start", "vocab_size")} == \
        {k: first[k] for k in ("sha256", "eos_id", "document_start", "vocab_size")}
    assert mine["origin"] == str(halves / "builtin-code")


# -- the formats corpora ship in --------------------------------------------------------------


def test_jsonl_zst_a_datasets_folder_and_a_hugging_face_tokenizer_folder(tmp_path, prepare):
    import datasets
    import zstandard

    from tests.helpers.hf_tokenizer import llama3_tokenizer

    web = [f"web page {i}: the sun rises in the east " * (i % 4 + 1) for i in range(80)]
    code = [f"def f{i}(x):\n    return x * {i}\n" for i in range(80)]
    (tmp_path / "web.jsonl.zst").write_bytes(
        zstandard.ZstdCompressor().compress("\n".join(json.dumps({"text": t}) for t in web).encode()))
    datasets.Dataset.from_dict({"content": code}).save_to_disk(str(tmp_path / "code"), num_shards=2)
    model = tmp_path / "model"
    model.mkdir()
    tokenizer = llama3_tokenizer(model / "tokenizer.json")
    (model / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|eot_id|>"}))
    out = str(tmp_path / "data")
    assert prepare("--jsonl", str(tmp_path / "web.jsonl.zst"), "--hf-dataset", str(tmp_path / "code"),
                   "--text-column", "content", "--tokenizer", str(model), "--out", out, "--val-fraction", "0.2")[0] == 0
    manifest = read_manifest(out)
    assert [s["kind"] for s in manifest["sources"]] == ["jsonl", "hf_dataset"]
    entry = manifest["tokenizer"]
    assert (entry["eos_token"], entry["eos_id"], entry["document_start"]) == ("<|eot_id|>", 3, "bos")
    assert entry["origin"] == str(model) and entry["bos_id"] == 0
    tokens = np.concatenate([read_split_tokens(os.path.join(out, s), "uint16") for s in ("train", "val")])
    cuts = np.flatnonzero(tokens == 3)
    docs = [tokens[a:b] for a, b in zip(np.concatenate([[0], cuts[:-1] + 1]), cuts)]
    assert all(doc[0] == 0 for doc in docs)
    assert sorted(tokenizer.decode(doc[1:].tolist()) for doc in docs) == sorted(web + code)

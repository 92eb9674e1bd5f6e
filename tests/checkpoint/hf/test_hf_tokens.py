"""framework/checkpoint/hf/tokens.py: a Hugging Face folder's special tokens, each of its three
files whole, in every --format hf export made from it: directly, and after continued
pretraining (#46 item 11). On the main before this module, the Qwen2.5-Instruct layout lost
generation_config's eos list [2, 0] and its pad (so the export never stopped at the chat's end
and ``tok(texts, padding=True)`` failed), gained a BOS its tokenizer never had, and, after
continued pretraining, wrote bos_token_id null and the eos list as [0, 2]."""

from __future__ import annotations

import json
import sysconfig
from pathlib import Path

import pytest

from data_prep.prepare import main as prepare_main
from framework.checkpoint.export import main as export_main
from framework.checkpoint.hf.tokens import read_hf_tokens
from framework.training.pretrain import main as pretrain_main
from tests.families.test_llama_continued import cpu_args
from tests.helpers.hf_qwen import tiny_hf_qwen
from tests.helpers.hf_tokenizer import qwen_instruct_metadata

TEXTS = ["The sun rises.", "def main():\n    return 0\n"]


@pytest.fixture(scope="module")
def qwen_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("qwen") / "hf"
    tiny_hf_qwen("qwen2", folder, vocab=300, layers=2, tie=True)
    qwen_instruct_metadata(folder)
    return folder


def read(folder: Path, name: str) -> dict:
    return json.loads((folder / name).read_text())


def assert_carried_whole(source: Path, out: Path) -> None:
    """Every token id and special token as the source's files say them, and transformers
    reads the export as it reads the source."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        assert read(out, "config.json").get(key) == read(source, "config.json").get(key), key
        assert read(out, "generation_config.json").get(key) == read(source, "generation_config.json").get(key), key
    tokens = read(out, "tokenizer_config.json")
    assert tokens.get("bos_token") is None and tokens["eos_token"] == "<|im_end|>"
    assert tokens["pad_token"] == "<|endoftext|>" and tokens["chat_template"].startswith("{% for m")
    assert AutoModelForCausalLM.from_pretrained(out).generation_config.eos_token_id == [2, 0]
    theirs, ours = AutoTokenizer.from_pretrained(source), AutoTokenizer.from_pretrained(out)
    assert ours.bos_token is None and ours.pad_token_id == 0
    assert ours(TEXTS, padding=True)["input_ids"] == theirs(TEXTS, padding=True)["input_ids"]


def test_the_record_keeps_each_file_as_it_is(qwen_folder):
    config = read(qwen_folder, "config.json")
    record = read_hf_tokens(qwen_folder, config)
    assert record["config"] == {key: config[key] for key in ("bos_token_id", "eos_token_id", "pad_token_id")
                                if key in config} and record["config"]["eos_token_id"] == 2
    assert record["generation_config"] == {"bos_token_id": 0, "eos_token_id": [2, 0], "pad_token_id": 0}
    entries = record["tokenizer_config"]
    assert entries["bos_token"] is None and entries["pad_token"] == "<|endoftext|>"
    assert "model_max_length" not in entries and "tokenizer_class" not in entries  # the export writes its own


def test_only_values_of_the_right_type_are_kept(tmp_path):
    """An AddedToken as older transformers wrote it becomes its content; anything else is dropped."""
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({
        "eos_token": {"__type": "AddedToken", "content": "</s>"}, "pad_token": 7, "unk_token": ["x"],
        "chat_template": {"code": "import os"}, "add_bos_token": "yes", "auto_map": {"AutoTokenizer": "x.Y"}}))
    assert read_hf_tokens(tmp_path, {})["tokenizer_config"] == {"eos_token": "</s>"}


def test_a_generation_config_with_a_bad_id_is_refused_in_one_line(tmp_path):
    from framework.checkpoint.base import CheckpointError

    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": {"x": 1}}))
    with pytest.raises(CheckpointError, match="generation_config.json: eos_token_id"):
        read_hf_tokens(tmp_path, {})


def test_a_direct_export_carries_the_folders_tokens_whole(qwen_folder, tmp_path):
    out = tmp_path / "out"
    assert export_main(["--ckpt", str(qwen_folder), "--out", str(out), "--format", "hf"]) == 0
    assert_carried_whole(qwen_folder, out)


def test_an_export_with_another_tokenizer_names_that_tokenizers_tokens(qwen_folder, tmp_path):
    """The carried token strings belong to the folder's tokenizer.json; another file gets its own."""
    from tests.helpers.hf_tokenizer import no_bos_tokenizer

    other = tmp_path / "other.json"
    no_bos_tokenizer(other)
    out = tmp_path / "out"
    assert export_main(["--ckpt", str(qwen_folder), "--out", str(out), "--format", "hf", "--tokenizer",
                        str(other)]) == 0
    assert "pad_token" not in read(out, "tokenizer_config.json")


def test_continued_pretraining_keeps_the_folders_tokens_into_its_hf_export(qwen_folder, tmp_path):
    corpus = str(Path(sysconfig.get_paths()["stdlib"]) / "json" / "*.py")
    data = tmp_path / "data"
    assert prepare_main(["--files", corpus, "--tokenizer", str(qwen_folder / "tokenizer.json"), "--out", str(data),
                         "--val-fraction", "0.3", "--chunk-tokens", "4096", "--workers", "1", "--no-progress"]) == 0
    root = tmp_path / "run"
    assert pretrain_main(cpu_args(qwen_folder, data, root, steps=2, p_max=0.2)) == 0
    out = tmp_path / "hf-out"
    assert export_main(["--ckpt", str(root / "export"), "--out", str(out), "--format", "hf"]) == 0
    assert_carried_whole(qwen_folder, out)
    again = tmp_path / "again"  # the run's layerdrop export and its checkpoints carry it too
    assert export_main(["--ckpt", str(root / "checkpoints" / "last.ckpt"), "--out", str(again), "--format", "hf"]) == 0
    assert_carried_whole(qwen_folder, again)

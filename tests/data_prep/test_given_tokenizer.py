"""``prepare --tokenizer PATH``: a tokenizer.json, a prepared folder (its recorded EOS and
document start) or a Hugging Face model folder (its special tokens, its post-processor's BOS)."""

import json
import os
import shutil

import pytest

from data_prep.errors import PrepareError
from data_prep.given_tokenizer import load_given_tokenizer
from framework.files.manifest import sha256_of
from framework.tokenizer import TokenizerError
from tests.helpers.hf_tokenizer import llama3_tokenizer, no_bos_tokenizer


def test_a_tokenizer_file(tmp_path):
    no_bos_tokenizer(tmp_path / "gpt2.json")
    given = load_given_tokenizer(str(tmp_path / "gpt2.json"))
    assert (given.eos_token, given.eos_id, given.document_start) == ("<|endoftext|>", 0, "eos")
    assert given.path == str(tmp_path / "gpt2.json") and given.origin == str(tmp_path / "gpt2.json")


def test_a_prepared_folder_gives_its_recorded_conventions(prepared, tmp_path):
    """The manifest's EOS and document start, even where the file alone would say otherwise."""
    folder = shutil.copytree(prepared, tmp_path / "prepared")
    manifest = json.loads((folder / "manifest.json").read_text())
    given = load_given_tokenizer(str(folder))
    assert given.path == str(folder / "tokenizer.json") and given.origin == str(folder)
    assert (given.eos_token, given.eos_id, given.document_start) == ("<|endoftext|>", 0, "eos")
    assert sha256_of(given.path) == manifest["tokenizer"]["sha256"]


def test_a_folder_prepared_with_its_own_eos_keeps_it(tmp_path):
    """A BPE whose EOS is "</s>" and which also holds "<|endoftext|>": the file alone would
    pick the first usual name; the manifest says "</s>"."""
    from tests.helpers.hf_tokenizer import byte_level_bpe

    folder = tmp_path / "prepared"
    folder.mkdir()
    byte_level_bpe(300, ("</s>", "<|endoftext|>")).save(str(folder / "tokenizer.json"))
    record = {"file": "tokenizer.json", "sha256": sha256_of(folder / "tokenizer.json"), "eos_token": "</s>",
              "eos_id": 0, "document_start": "eos"}
    (folder / "manifest.json").write_text(json.dumps({"tokenizer": record}))
    assert load_given_tokenizer(str(folder / "tokenizer.json")).eos_token == "<|endoftext|>"
    assert (load_given_tokenizer(str(folder)).eos_token, load_given_tokenizer(str(folder)).eos_id) == ("</s>", 0)
    assert load_given_tokenizer(str(folder), eos_token="<|endoftext|>").eos_id == 1  # the flag wins


def test_a_prepared_folder_whose_tokenizer_changed_is_refused(prepared, tmp_path):
    folder = shutil.copytree(prepared, tmp_path / "prepared")
    no_bos_tokenizer(folder / "tokenizer.json")
    with pytest.raises(PrepareError, match="is not the tokenizer its manifest.json records"):
        load_given_tokenizer(str(folder))


@pytest.mark.parametrize("config, eos", [
    ({"tokenizer_config.json": {"eos_token": "<|eot_id|>", "bos_token": "<|begin_of_text|>"}}, "<|eot_id|>"),
    ({"special_tokens_map.json": {"eos_token": {"content": "<|eom_id|>", "lstrip": False}}}, "<|eom_id|>"),
    ({"config.json": {"eos_token_id": [3, 1]}}, "<|eot_id|>"),
    ({}, "<|end_of_text|>"),  # none named: the first usual EOS name in the vocabulary
])
def test_a_hugging_face_folder_names_its_eos_and_its_bos_starts_documents(tmp_path, config, eos):
    folder = tmp_path / "llama"
    folder.mkdir()
    tokenizer = llama3_tokenizer(folder / "tokenizer.json")
    for name, content in config.items():
        (folder / name).write_text(json.dumps(content))
    given = load_given_tokenizer(str(folder))
    assert (given.eos_token, given.eos_id) == (eos, tokenizer.token_to_id(eos))
    assert given.document_start == "bos" and given.origin == str(folder)
    assert load_given_tokenizer(str(folder), document_start="eos").document_start == "eos"


def test_a_hugging_face_eos_missing_from_the_vocabulary_names_where_it_came_from(tmp_path):
    llama3_tokenizer(tmp_path / "tokenizer.json")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>"}))
    with pytest.raises(TokenizerError, match="the eos_token of tokenizer_config.json '</s>' is not in the vocabulary"):
        load_given_tokenizer(str(tmp_path))


def test_refusals(tmp_path):
    (tmp_path / "sp").mkdir()
    (tmp_path / "sp" / "tokenizer.model").write_bytes(b"\x0a\x00")
    with pytest.raises(PrepareError, match="the folder holds no tokenizer.json"):
        load_given_tokenizer(str(tmp_path / "sp"))
    with pytest.raises(PrepareError, match="no such file or folder"):
        load_given_tokenizer(str(tmp_path / "nowhere"))
    no_bos_tokenizer(tmp_path / "gpt2.json")
    with pytest.raises(PrepareError, match="adds no BOS"):
        load_given_tokenizer(str(tmp_path / "gpt2.json"), document_start="bos")
    assert not os.path.exists(tmp_path / "nowhere")

"""framework/tokenizer.py: loading, the EOS and BOS rules, prompts encoded as the model saw
documents in training (and as Hugging Face's ``tok(text)`` for its folders), the ids
that end a generation, and the refusal of data tokenized for another model."""

from __future__ import annotations

import json
import shutil

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from framework.checkpoint import Checkpoint, export_decoder, load_decoder
from framework.tokenizer import (TextCodec, TokenizerError, check_model_tokenizer, find_bos, find_eos,
                                 load_tokenizer, vocab_size_of)
from tests.helpers.hf_llama import tiny_hf_llama
from tests.helpers.hostile_files import deep_json
from tests.helpers.hf_tokenizer import llama3_tokenizer, no_bos_tokenizer

TEXT = "The sun rises in the east"


def _word_level(tmp_path, vocab):
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    path = str(tmp_path / "tokenizer.json")
    tokenizer.save(path)
    return path


def test_eos_is_found_by_its_usual_names(tmp_path):
    path = _word_level(tmp_path, {"[UNK]": 0, "hello": 1, "</s>": 7, "<|end_of_text|>": 9})
    tokenizer = load_tokenizer(path)
    assert find_eos(tokenizer) == ("<|end_of_text|>", 9)  # earlier in EOS_CANDIDATES
    assert find_eos(tokenizer, "</s>") == ("</s>", 7)
    assert vocab_size_of(tokenizer) == 10
    with pytest.raises(TokenizerError, match="--eos-token '<eos>' is not in the vocabulary"):
        find_eos(tokenizer, "<eos>")


def test_a_tokenizer_without_eos_is_refused(tmp_path):
    path = _word_level(tmp_path, {"[UNK]": 0, "hello": 1})
    with pytest.raises(TokenizerError, match="none of the usual EOS tokens.*--eos-token"):
        find_eos(load_tokenizer(path), where=path)


def test_unreadable_tokenizer_files(tmp_path):
    with pytest.raises(TokenizerError, match="no such file"):
        load_tokenizer(str(tmp_path / "missing.json"))
    (tmp_path / "bad.json").write_text('{"version": "1.0", "model": 3}')
    with pytest.raises(TokenizerError, match="not a readable tokenizer.json"):
        load_tokenizer(str(tmp_path / "bad.json"))


def test_the_bos_is_what_the_post_processor_puts_first():
    assert find_bos(llama3_tokenizer()) == ("<|begin_of_text|>", 0)
    assert find_bos(no_bos_tokenizer()) is None


@pytest.fixture(scope="module")
def llama3_folder(tmp_path_factory):
    """A Hugging Face Llama folder with a Llama-3-like tokenizer and an eos_token_id list."""
    folder = tmp_path_factory.mktemp("llama3") / "hf"
    tiny_hf_llama(folder, vocab=300, layers=2)
    llama3_tokenizer(folder / "tokenizer.json")
    config = json.loads((folder / "config.json").read_text())
    config.update(bos_token_id=0, eos_token_id=[1, 3])
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "generation_config.json").write_text(json.dumps({"bos_token_id": 0, "eos_token_id": [1, 2, 3]}))
    return folder


def test_a_prompt_is_encoded_as_hugging_face_does(llama3_folder):
    """BOS first (<|begin_of_text|>), not the EOS that separates layerdrop's own documents."""
    codec = TextCodec.for_checkpoint(Checkpoint.open(llama3_folder))
    hf = PreTrainedTokenizerFast(tokenizer_file=str(llama3_folder / "tokenizer.json"))
    for text in (TEXT, "def main():\n    return 0", "x"):
        assert codec.encode_prompt(text) == hf(text)["input_ids"]
    assert codec.encode_prompt(TEXT)[0] == 0


def test_a_hugging_face_folder_without_a_bos_adds_nothing(tmp_path):
    folder = tmp_path / "hf"
    tiny_hf_llama(folder, vocab=300, layers=2)
    no_bos_tokenizer(folder / "tokenizer.json")
    codec = TextCodec.for_checkpoint(Checkpoint.open(folder))
    hf = PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"))
    assert codec.encode_prompt(TEXT) == hf(TEXT)["input_ids"] == codec.encode(TEXT)


def test_generation_stops_at_every_id_of_an_eos_list(llama3_folder):
    codec = TextCodec.for_checkpoint(Checkpoint.open(llama3_folder))
    assert codec.eos_id == 1 and set(codec.stop_ids) == {1, 2, 3}
    assert TextCodec.for_checkpoint(Checkpoint.open(llama3_folder), eos_token="<|eot_id|>").stop_ids == (3,)


def test_a_generation_config_nested_too_deep_changes_no_token(llama3_folder, tmp_path):
    """As a broken generation_config.json: config.json's ids stand (issue 46: a RecursionError traceback)."""
    folder = tmp_path / "deep"
    shutil.copytree(llama3_folder, folder)
    (folder / "generation_config.json").write_text('{"eos_token_id": ' + deep_json(5_000) + "}")
    codec = TextCodec.for_checkpoint(Checkpoint.open(folder))
    assert codec.eos_id == 1 and set(codec.stop_ids) == {1, 3}


def test_layerdrop_models_keep_the_convention_they_were_trained_with(tmp_path):
    """An export of our own (trained BPE, no BOS, no recorded convention): EOS first, as
    between the training documents; a record saying "bos" is followed."""
    decoder, _ = load_decoder(tiny_hf_llama_folder(tmp_path / "hf"))
    plain = tmp_path / "plain"
    export_decoder(decoder, plain)
    no_bos_tokenizer(plain / "tokenizer.json")
    codec = TextCodec.for_checkpoint(Checkpoint.open(plain))
    assert codec.encode_prompt(TEXT) == [codec.eos_id] + codec.encode(TEXT)

    llama3 = tmp_path / "llama3.json"
    llama3_tokenizer(llama3)
    for start, first in (("eos", 1), ("bos", 0)):  # the record wins over the tokenizer's own BOS
        recorded = tmp_path / start
        record = {"file": "tokenizer.json", "eos_id": 1, "bos_id": 0, "document_start": start}
        export_decoder(decoder, recorded, extra={"tokenizer": record}, tokenizer=llama3)
        codec = TextCodec.for_checkpoint(Checkpoint.open(recorded))
        assert codec.encode_prompt(TEXT) == [first] + codec.encode(TEXT)


def tiny_hf_llama_folder(folder):
    tiny_hf_llama(folder, vocab=300, layers=2)
    return folder


def test_data_of_another_tokenizer_is_refused_naming_both(llama3_folder, tmp_path):
    model_file = llama3_folder / "tokenizer.json"
    same_bytes = {"sha256": None, "vocab_size": 300}
    check_model_tokenizer(Checkpoint.open(llama3_folder), str(model_file), same_bytes)  # the same vocabulary
    reformatted = tmp_path / "reformatted.json"
    reformatted.write_text(json.dumps(json.loads(model_file.read_text()), indent=4))
    check_model_tokenizer(Checkpoint.open(llama3_folder), str(reformatted), same_bytes)  # other bytes, same vocabulary
    other = tmp_path / "other.json"
    no_bos_tokenizer(other)
    with pytest.raises(TokenizerError) as refused:
        check_model_tokenizer(Checkpoint.open(llama3_folder), str(other), {"sha256": "0" * 64, "vocab_size": 300})
    message = str(refused.value)
    assert str(other) in message and str(llama3_folder) in message and "\n" not in message


def test_a_model_without_a_tokenizer_needs_the_data_vocabulary_to_match(tmp_path):
    folder = tiny_hf_llama_folder(tmp_path / "hf")
    check_model_tokenizer(Checkpoint.open(folder), "data/tokenizer.json", {"vocab_size": 300})
    with pytest.raises(TokenizerError, match="vocabulary of 8192.*300 embedding rows and no tokenizer.json"):
        check_model_tokenizer(Checkpoint.open(folder), "data/tokenizer.json", {"vocab_size": 8192})


def test_a_copied_tokenizer_is_the_same(llama3_folder, tmp_path):
    copy = tmp_path / "tokenizer.json"
    shutil.copy(llama3_folder / "tokenizer.json", copy)
    from framework.files.manifest import sha256_of

    check_model_tokenizer(Checkpoint.open(llama3_folder), str(copy), {"sha256": sha256_of(copy), "vocab_size": 300})


def test_the_start_id_is_the_bos_or_the_eos(llama3_folder, tmp_path):
    assert TextCodec.for_checkpoint(Checkpoint.open(llama3_folder)).start_id == 0
    folder = tiny_hf_llama_folder(tmp_path / "hf")
    no_bos_tokenizer(folder / "tokenizer.json")
    assert TextCodec.for_checkpoint(Checkpoint.open(folder)).start_id == 0  # <|endoftext|>: the only special token


def test_the_tokenizer_home_reads_checkpoints_it_is_handed_and_opens_none(llama3_folder):
    """framework/tokenizer.py sits below the checkpoint package: a path is refused, naming
    the way to open it."""
    with pytest.raises(TypeError, match=r"is not an opened checkpoint: pass framework.checkpoint.Checkpoint.open"):
        TextCodec.for_checkpoint(llama3_folder)
    assert TextCodec.for_checkpoint(Checkpoint.open(llama3_folder)).eos_id == 1

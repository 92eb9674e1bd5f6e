import os

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

from data_prep.errors import PrepareError
from data_prep.tokenizer import DEFAULT_EOS, find_eos, load_tokenizer, train_tokenizer, vocab_size_of


@pytest.fixture(scope="module")
def texts(code_corpus):
    return [open(os.path.join(code_corpus, name), encoding="utf-8").read() for name in sorted(os.listdir(code_corpus))]


def test_training_is_deterministic_and_sized(texts, tmp_path):
    first, second = train_tokenizer(texts, 400), train_tokenizer(texts, 400)
    first.save(str(tmp_path / "a.json"))
    second.save(str(tmp_path / "b.json"))
    assert (tmp_path / "a.json").read_bytes() == (tmp_path / "b.json").read_bytes()
    assert vocab_size_of(first) == 400
    assert first.token_to_id(DEFAULT_EOS) == 0


def test_byte_level_round_trip_of_any_text(texts):
    tokenizer = train_tokenizer(texts, 400)
    for text in texts[:5] + ["unicode \u00e9\u4e2d\U0001f600 and \ufffd", "\t\n  spaces  \n"]:
        ids = tokenizer.encode(text, add_special_tokens=False).ids
        assert tokenizer.decode(ids) == text


def _word_level(tmp_path, vocab):
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    path = str(tmp_path / "tokenizer.json")
    tokenizer.save(path)
    return path


def test_eos_is_found_by_its_usual_names(tmp_path):
    path = _word_level(tmp_path, {"[UNK]": 0, "hello": 1, "</s>": 7, "<|end_of_text|>": 9})
    tokenizer = load_tokenizer(path)
    assert find_eos(tokenizer, None, path) == ("<|end_of_text|>", 9)  # earlier in EOS_CANDIDATES
    assert find_eos(tokenizer, "</s>", path) == ("</s>", 7)
    assert vocab_size_of(tokenizer) == 10
    with pytest.raises(PrepareError, match="--eos-token '<eos>' is not in the vocabulary"):
        find_eos(tokenizer, "<eos>", path)


def test_a_tokenizer_without_eos_is_refused(tmp_path):
    path = _word_level(tmp_path, {"[UNK]": 0, "hello": 1})
    with pytest.raises(PrepareError, match="none of the usual EOS tokens.*--eos-token"):
        find_eos(load_tokenizer(path), None, path)


def test_unreadable_tokenizer_files(tmp_path):
    with pytest.raises(PrepareError, match="no such file"):
        load_tokenizer(str(tmp_path / "missing.json"))
    (tmp_path / "bad.json").write_text('{"version": "1.0", "model": 3}')
    with pytest.raises(PrepareError, match="not a readable tokenizer.json"):
        load_tokenizer(str(tmp_path / "bad.json"))

import os

import pytest

from data_prep.trained_tokenizer import DEFAULT_EOS, train_tokenizer
from framework.tokenizer import vocab_size_of


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

import numpy as np
import pytest

from data_prep.encoding import EncodedCorpus, encode_documents, token_dtype
from data_prep.errors import PrepareError
from data_prep.sources.document import Document
from data_prep.split import TRAIN, VAL
from data_prep.trained_tokenizer import train_tokenizer

TEXTS = [f"document {i}: " + "some words and more words " * (i + 1) for i in range(30)]


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(TEXTS, 300)


def _encode(tokenizer, tmp_path, max_tokens=None, texts=TEXTS):
    docs = (Document(text, f"doc{i}") for i, text in enumerate(texts))
    path = str(tmp_path / "tokens.bin")
    corpus = encode_documents(docs, tokenizer, 0, np.dtype(np.uint16), seed=0, tokens_path=path,
                              max_tokens=max_tokens, progress=False)
    return corpus, np.fromfile(path, dtype=np.uint16)


def test_every_document_is_followed_by_eos(tokenizer, tmp_path):
    corpus, tokens = _encode(tokenizer, tmp_path)
    expected = np.concatenate([tokenizer.encode(text, add_special_tokens=False).ids + [0] for text in TEXTS])
    assert np.array_equal(tokens, expected)
    assert np.array_equal(np.flatnonzero(tokens == 0) + 1, corpus.doc_ends)
    assert corpus.num_tokens == len(tokens) and not corpus.truncated


def test_special_token_text_inside_a_document_is_not_an_eos(tokenizer, tmp_path):
    corpus, tokens = _encode(tokenizer, tmp_path, texts=["before <|endoftext|> after", "next"])
    assert np.count_nonzero(tokens == 0) == 2
    assert tokenizer.decode(tokens[: corpus.doc_ends[0] - 1].tolist()) == "before <|endoftext|> after"


@pytest.mark.parametrize("cap", [1, 57, 400])
def test_max_tokens_is_exact(tokenizer, tmp_path, cap):
    full, all_tokens = _encode(tokenizer, tmp_path / "..")
    corpus, tokens = _encode(tokenizer, tmp_path, max_tokens=cap)
    assert len(tokens) == corpus.num_tokens == cap
    assert np.array_equal(tokens, all_tokens[:cap])
    assert corpus.truncated == (cap not in full.doc_ends)


def test_splits_are_by_key_and_never_empty(tmp_path):
    ends = np.array([5, 9, 20, 22], dtype=np.int64)
    corpus = EncodedCorpus("unused", np.dtype(np.uint16), ends, np.array([0.5, 0.05, 0.9, 0.3]), False)
    assert corpus.doc_splits(0.1).tolist() == [TRAIN, VAL, TRAIN, TRAIN]
    assert corpus.doc_splits(0.01).tolist() == [TRAIN, VAL, TRAIN, TRAIN]  # smallest key moved to val
    assert corpus.doc_splits(0.99).tolist() == [VAL, VAL, TRAIN, VAL]  # largest key moved to train
    spans = corpus.split_spans(0.1)
    assert spans["val"].tolist() == [[5, 9]]
    assert spans["train"].tolist() == [[0, 5], [9, 20], [20, 22]]
    with pytest.raises(PrepareError, match="needs at least 2"):
        EncodedCorpus("unused", np.dtype(np.uint16), ends[:1], np.array([0.5]), False).doc_splits(0.1)


def test_token_dtype_boundary():
    assert token_dtype(2**16) == np.uint16
    assert token_dtype(2**16 + 1) == np.uint32

from data_prep.split import TRAIN, VAL, split_key, split_of


def test_split_is_a_pure_function_of_text_and_seed():
    assert split_key("some document", 0) == split_key("some document", 0)
    assert split_key("some document", 0) != split_key("some document", 1)
    assert 0 <= split_key("", 0) < 1


def test_fraction_of_documents_in_val():
    keys = [split_key(f"document number {i}", 7) for i in range(4000)]
    val = sum(split_of(key, 0.1) == VAL for key in keys)
    assert 320 < val < 480  # binomial(4000, 0.1): mean 400, sd 19


def test_growing_the_corpus_never_moves_a_document():
    fraction = 0.3
    before = {i: split_of(split_key(f"doc {i}", 3), fraction) for i in range(200)}
    after = {i: split_of(split_key(f"doc {i}", 3), fraction) for i in range(400)}
    assert all(after[i] == before[i] for i in before)
    assert {TRAIN, VAL} == set(after.values())

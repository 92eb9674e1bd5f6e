"""eval/decoding/transcripts.py: what each sequence wrote and why it ended."""

from __future__ import annotations

from eval.decoding.transcripts import Transcripts


def test_a_sequence_ends_at_any_id_of_an_eos_list():
    """Llama-3.x-Instruct ends a turn with <|eot_id|>, a text with <|end_of_text|>: both stop."""
    book = Transcripts(3, 10, eos_id=[7, 9])
    assert book.add(0, [4, 5, 9, 6], [1.0] * 4) == 2
    assert book.add(1, [4, 7, 6], [1.0] * 3) == 1
    assert book.add(2, [4, 5, 6], [1.0] * 3) == 3
    assert [item.finish_reason for item in book.items] == ["eos", "eos", None]
    assert [item.tokens for item in book.items] == [[4, 5], [4], [4, 5, 6]]


def test_one_eos_id_or_none():
    book = Transcripts(2, 3, eos_id=5)
    book.add(0, [1, 5, 2], [1.0] * 3)
    book.add(1, [5, 5, 5], [1.0] * 3)
    assert [item.tokens for item in book.items] == [[1], []]
    free = Transcripts(1, 3)
    free.add(0, [5, 5, 5, 5], [1.0] * 4)
    assert free.items[0].tokens == [5, 5, 5] and free.items[0].finish_reason == "length"

"""Prompt files, and the one way contexts longer than the model's window are cut."""

from __future__ import annotations

import json

import pytest

from eval.inputs import ContextLimit, load_prompts, read_prompt_file, validation_prompts
from tests.helpers.hostile_files import deep_json


def test_prompt_files_by_suffix(tmp_path):
    (tmp_path / "p.txt").write_text("first\n\nsecond line\\nwith a newline\n")
    assert read_prompt_file(str(tmp_path / "p.txt")) == ["first", "second line\nwith a newline"]
    (tmp_path / "p.jsonl").write_text('{"text": "a"}\n\n{"prompt": "b", "id": 2}\n')
    assert read_prompt_file(str(tmp_path / "p.jsonl")) == ["a", "b"]
    (tmp_path / "ids.json").write_text(json.dumps([[1, 2], [3]]))
    assert read_prompt_file(str(tmp_path / "ids.json")) == [[1, 2], [3]]
    (tmp_path / "texts.json").write_text(json.dumps(["x", "y"]))
    assert read_prompt_file(str(tmp_path / "texts.json")) == ["x", "y"]


@pytest.mark.parametrize("name, content, message", [
    ("e.txt", "\n \n", "--prompts '{}' is empty"),
    ("bad.json", "[1, 2", "--prompts '{}' is not valid JSON"),
    ("mixed.json", '[[1], "a"]', "expected a JSON list of strings or of non-empty lists of token ids"),
    ("rows.jsonl", '{"text": "a"}\n{"body": "b"}\n', "--prompts '{}':2: each JSONL row needs a \"text\""),
    ("object.json", '{"text": "a"}', "--prompts '{}' is invalid: it holds an object, expected a JSON list"),
    ("number.json", "3", "--prompts '{}' is invalid: it holds a number, expected a JSON list"),
    ("string.json", '"abc"', "--prompts '{}' is invalid: it holds a string, expected a JSON list"),
    ("deep.json", deep_json(5_000), "--prompts '{}' is refused: it is nested more than 100 levels deep"),
    ("deep.jsonl", '{"text": "a"}\n{"text": ' + deep_json(101) + "}", "--prompts '{}':2 is refused: it is nested"),
])
def test_bad_prompt_files_name_the_flag_and_the_file(tmp_path, name, content, message):
    (tmp_path / name).write_text(content)
    with pytest.raises(ValueError, match=None) as error:
        read_prompt_file(str(tmp_path / name))
    assert message.format(tmp_path / name) in str(error.value)


def test_empty_text_prompts_are_refused():
    with pytest.raises(ValueError, match="--prompt: prompt 2 is empty"):
        load_prompts(texts=["a", ""], codec=lambda: None)


def test_long_contexts_keep_their_last_tokens_and_say_so_once(capsys):
    limit = ContextLimit(8)
    assert limit.fit(list(range(5)), reserve=2) == list(range(5))
    assert limit.fit(list(range(20)), reserve=2) == list(range(14, 20))
    assert limit.fit(list(range(10)), reserve=2) == list(range(4, 10))
    line = limit.report()
    assert line == ("note: 2 prompt(s) longer than the model's context (max_seq_len 8) less the 2 tokens to "
                    "generate (--max-new-tokens) kept only their last 6 tokens (the longest had 20)")
    assert capsys.readouterr().err.strip() == line
    assert ContextLimit(8).report() is None
    assert ContextLimit(8, "sequence").fit_length(16, "--seq-len") == 8
    assert "--seq-len 16 is longer than the model's context (max_seq_len 8)" in capsys.readouterr().err


def test_a_prompt_offset_passes_over_the_first_prompts(tmp_path, prepared_tokens):
    (tmp_path / "ids.json").write_text(json.dumps([[1], [2], [3], [4]]))
    assert load_prompts(prompts_file=str(tmp_path / "ids.json"), count=2, offset=1)[0] == [[2], [3]]
    first = validation_prompts(str(prepared_tokens), count=6, length=16)
    assert validation_prompts(str(prepared_tokens), count=3, length=16, offset=3) == first[3:]
    assert load_prompts(data=str(prepared_tokens), count=2, length=16, offset=4)[0] == first[4:]
    with pytest.raises(ValueError, match="--prompt-offset 4 is invalid: it passes over all 4 prompts"):
        load_prompts(prompts_file=str(tmp_path / "ids.json"), offset=4)
    with pytest.raises(ValueError, match="none is left past --prompt-offset 100000"):
        validation_prompts(str(prepared_tokens), count=1, length=16, offset=100_000)

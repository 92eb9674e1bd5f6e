"""benchmarks/downstream_exits.py: both ways run through the command, give the same accuracies at
every exit, and the JSON holds the ratio; a missing tokenizer is a one-line error."""

from __future__ import annotations

import json

import pytest

from benchmarks import downstream_exits
from eval.downstream.harness import force_offline
from tests.eval.tiny_lm import fixture_texts, train_tokenizer

force_offline()


def test_one_pass_and_per_exit_agree_and_the_ratio_is_written(tmp_path, monkeypatch, capsys):
    tokenizer = tmp_path / "tokenizer.json"
    train_tokenizer(fixture_texts()).save(str(tokenizer))
    monkeypatch.setattr(downstream_exits, "SHAPES", {"tiny (d16 L2)": (16, 2, 2)})
    out = tmp_path / "result.json"
    assert downstream_exits.main(["--tokenizer", str(tokenizer), "--tasks", "piqa", "--limit", "3", "--reps", "1",
                                  "--out", str(out)]) == 0
    [row] = json.loads(out.read_text())["shapes"].values()
    assert row["identical_accuracies"] is True and row["n_layers"] == 2 and row["vocab_size"] == 300
    assert row["per_exit_over_one_pass_cpu"] > 0 and "| tiny (d16 L2) | 2 |" in capsys.readouterr().out


def test_a_missing_tokenizer_is_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        downstream_exits.parse_args(["--tokenizer", str(tmp_path / "none.json")])
    assert exit_info.value.code == 2 and "prepare data first" in capsys.readouterr().err

"""`adapters eval`: bad input refused in one line (its numbers: tests/eval/adapters/test_fit.py)."""

from __future__ import annotations

import pytest

from eval.adapters.evaluation import eval_main


def test_eval_refuses_a_folder_without_adapters(prepared, tmp_path, capsys):
    with pytest.raises(SystemExit):
        eval_main(["--adapters", str(tmp_path), "--data", str(prepared), "--out", str(tmp_path / "r.json")])
    assert "has no adapters.safetensors" in capsys.readouterr().err

"""`layerdrop speculate search` (eval/decoding/draft_search.py): the command, its report
and its refusals (the searches: test_skip_set_search.py; the objective: test_draft_objective.py)."""

from __future__ import annotations

import copy
import json

import pytest

from eval.decoding.draft_objective import CalibrationObjective
from eval.decoding.draft_search import main
from eval.decoding.skip_set_search import METHODS
from framework.checkpoint import export_decoder
from tests.helpers.checkpoint_run import count_checkpoint_opens
from tests.eval.decoding.test_draft_objective import model, prompts  # noqa: F401  (the objective's fixtures)


@pytest.fixture(scope="module")
def exported(tmp_path_factory, model, prompts):
    root = tmp_path_factory.mktemp("search")
    export_decoder(copy.deepcopy(model).float(), root / "model")
    (root / "prompts.json").write_text(json.dumps([p.tolist() for p in prompts]))
    return root


def test_cli_search_reports_every_method(exported, model, prompts, capsys, monkeypatch):
    out = exported / "search.json"
    opened = count_checkpoint_opens(monkeypatch)
    code = main(["--ckpt", str(exported / "model"), "--prompts", str(exported / "prompts.json"),
                 "--calibration-prompts", "3", "--confirm-prompts", "2", "--budget", "6",
                 "--cost", "layers", "--max-new-tokens", "12", "--repeats", "1", "--out", str(out)])
    assert code == 0 and opened == [exported / "model"]  # opened and proven once for the whole command
    report = json.loads(out.read_text())
    assert set(report["methods"]) == set(METHODS)
    reference = CalibrationObjective(model, prompts[:3], new_tokens=12, gamma=5)  # the same objective, anew
    for r in report["methods"].values():
        assert r["evaluations"] <= 6
        estimate = reference.estimate(r["skip_layers"])
        assert r["estimated_speedup"] == pytest.approx(estimate["speedup"])
        assert r["estimated_acceptance"] == pytest.approx(estimate["acceptance"])
        assert r["identical_to_greedy"] is True
    best = report["best"]
    assert best["speedup"] == max(r["measured_speedup"] for r in report["methods"].values())
    assert best["skip_layers"] == report["methods"][best["method"]]["skip_layers"]
    assert report["exit_draft_estimates"] == {str(e): pytest.approx(reference.estimate(exit_layer=e))
                                              for e in (1, 2, 3)}
    exit_draft = report["best_exit"]  # the 2 best-estimated exits decoded for real, the faster one kept
    ranked = sorted(report["exit_draft_estimates"], key=lambda e: report["exit_draft_estimates"][e]["speedup"])
    assert set(exit_draft["measured"]) == set(ranked[-2:]) and exit_draft["identical_to_greedy"] is True
    assert exit_draft["speedup"] == max(run["speedup"] for run in exit_draft["measured"].values())
    assert exit_draft["speedup"] == exit_draft["measured"][str(exit_draft["exit_layer"])]["speedup"]
    assert "best:" in capsys.readouterr().out


@pytest.mark.parametrize("args,message", [
    (["--methods", "bayesian,random"], "--methods 'bayesian,random' is invalid"),
    (["--budget", "0"], "--budget=0 is invalid"),
    (["--ckpt", "/missing/model"], "does not exist"),
    (["--confirm-prompts", "4"], "5 prompts are too few"),
])
def test_cli_search_errors(exported, capsys, args, message):
    base = ["--ckpt", str(exported / "model"), "--prompts", str(exported / "prompts.json"),
            "--calibration-prompts", "3", "--out", str(exported / "never.json")]
    with pytest.raises(SystemExit) as exit_info:
        main(base + args)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err

"""`layerdrop speculate search` (eval/decoding/draft_search.py): the command, its report
and its refusals (the searches: test_skip_set_search.py; the objective: test_draft_objective.py),
and `speculate run --draft-from`, which decodes with the draft a search found."""

from __future__ import annotations

import copy
import json

import pytest

from eval.decoding.draft_objective import CalibrationObjective
from eval.decoding.draft_search import main
from eval.decoding.drafts import searched_draft
from eval.decoding.speedup import main as run_main
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


# ---------------------------------------------------------------- speculate run --draft-from
def search_report(best: dict, best_exit: dict | None, *, num_layers: int = 4, gamma: int = 3) -> dict:
    return {"num_layers": num_layers, "gamma": gamma, "best": {"method": "genetic", **best},
            **({"best_exit": best_exit} if best_exit is not None else {})}


SKIP = {"skip_layers": [1, 2], "exit_layer": None, "speedup": 1.2, "identical_to_greedy": True}
EXIT = {"skip_layers": [], "exit_layer": 2, "speedup": 1.4, "identical_to_greedy": True}


@pytest.mark.parametrize("best,best_exit,expected", [
    (SKIP, EXIT, "exit:2"),                                          # the faster of the two
    ({**SKIP, "speedup": 1.5}, EXIT, "skip:1,2"),
    (SKIP, {**EXIT, "identical_to_greedy": False}, "skip:1,2"),      # a lossy draft is never taken
    ({**SKIP, "skip_layers": [], "speedup": 0.9}, None, "skip:none"),  # a report from before exit drafts
])
def test_the_searched_draft_is_the_faster_lossless_one(tmp_path, best, best_exit, expected):
    (tmp_path / "search.json").write_text(json.dumps(search_report(best, best_exit)))
    assert searched_draft(tmp_path / "search.json", 4) == (expected, 3)


@pytest.mark.parametrize("content,message", [
    (None, "does not exist"),
    ("{", "is not a readable JSON report"),
    ('{"num_layers": 4}', "has no best draft: not a report of `layerdrop speculate search`"),
    (json.dumps(search_report(SKIP, EXIT, num_layers=6)), "was searched on a model of 6 layers, this one has 4"),
    (json.dumps(search_report(SKIP, EXIT, gamma=0)), "gamma=0 is invalid"),
    (json.dumps(search_report({**SKIP, "identical_to_greedy": False}, {**EXIT, "identical_to_greedy": None})),
     "no draft of the search was lossless"),
    (json.dumps(search_report(SKIP, {**EXIT, "exit_layer": 4, "speedup": 2.0})), "exit_layer=4 is invalid"),
])
def test_a_bad_search_report_is_refused_in_one_line(tmp_path, content, message):
    if content is not None:
        (tmp_path / "search.json").write_text(content)
    with pytest.raises(ValueError) as error:
        searched_draft(tmp_path / "search.json", 4)
    assert message in str(error.value) and "\n" not in str(error.value)
    assert f"--draft-from '{tmp_path / 'search.json'}'" in str(error.value)


def test_speculate_run_decodes_the_searched_draft_on_held_out_prompts(exported, prompts, monkeypatch):
    search = exported / "search-for-run.json"
    assert main(["--ckpt", str(exported / "model"), "--prompts", str(exported / "prompts.json"),
                 "--calibration-prompts", "2", "--confirm-prompts", "1", "--budget", "3", "--methods",
                 "hill_climbing", "--cost", "layers", "--max-new-tokens", "8", "--repeats", "1", "--gamma", "4",
                 "--out", str(search)]) == 0
    spec, gamma = searched_draft(search, 4)
    out = exported / "run-searched.json"
    assert run_main(["--ckpt", str(exported / "model"), "--draft-from", str(search), "--prompts",
                     str(exported / "prompts.json"), "--prompt-offset", "3", "--max-new-tokens", "8", "--repeats",
                     "1", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    kind, _, value = spec.partition(":")
    assert report["draft"] == kind and gamma == report["gamma"] == 4 and report["draft_from"] == str(search)
    assert (report["exit_layer"] == int(value)) if kind == "exit" else \
        (report["skip_layers"] == ([] if value == "none" else [int(i) for i in value.split(",")]))
    assert [row["prompt"] for row in report["outputs"]] == [p.tolist() for p in prompts[3:]]
    assert report["identical_to_greedy"] is True


@pytest.mark.parametrize("args,message", [
    (["--draft-from", "{root}/missing.json"], "does not exist"),
    (["--draft-from", "{root}/prompts.json", "--exit-layer", "2"], "not allowed with argument"),
    (["--prompt-offset", "-1", "--exit-layer", "2"], "--prompt-offset=-1 is invalid"),
    (["--prompt-offset", "99", "--exit-layer", "2"], "--prompt-offset 99 is invalid: it passes over all"),
])
def test_speculate_run_refuses_a_bad_draft_source_before_loading_the_model(exported, capsys, monkeypatch, args,
                                                                          message):
    from framework.checkpoint import Checkpoint

    monkeypatch.setattr(Checkpoint, "load_decoder",
                        lambda *a, **k: pytest.fail("the model was loaded"))
    with pytest.raises(SystemExit) as exit_info:
        run_main(["--ckpt", str(exported / "model"), "--prompts", str(exported / "prompts.json"),
                  "--out", str(exported / "never.json"), *(a.format(root=exported) for a in args)])
    assert exit_info.value.code == 2 and message in capsys.readouterr().err
    assert not (exported / "never.json").exists()

"""`export --format hf --draft-from SEARCH_REPORT` (framework/checkpoint/hf/draft.py): the searched
exit draft in generation_config.json, read back by transformers, whose generate then self-speculates
(its early-exit candidate generator runs) and gives plain greedy's tokens; refusals in one line."""

from __future__ import annotations

import json

import pytest
import torch

from eval.decoding.draft_search import main as search_main
from framework.checkpoint.export import main as export_main
from tests.helpers.hf_llama import tiny_hf_llama


@pytest.fixture(scope="module")
def searched(tmp_path_factory):
    """A Hugging Face Llama of 4 layers and a real `speculate search` report of it."""
    root = tmp_path_factory.mktemp("draft")
    tiny_hf_llama(root / "hf", vocab=300, layers=4, tie=True)
    generator = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 300, (10,), generator=generator).tolist() for _ in range(5)]
    (root / "prompts.json").write_text(json.dumps(prompts))
    assert search_main(["--ckpt", str(root / "hf"), "--prompts", str(root / "prompts.json"), "--methods",
                        "hill_climbing", "--calibration-prompts", "3", "--confirm-prompts", "2", "--budget", "4",
                        "--cost", "layers", "--max-new-tokens", "8", "--repeats", "1", "--gamma", "3",
                        "--out", str(root / "search.json")]) == 0
    return root, prompts


def test_transformers_self_speculates_with_the_searched_exit_and_plain_greedys_tokens(searched, tmp_path,
                                                                                      monkeypatch, capsys):
    from transformers import AutoModelForCausalLM
    from transformers.generation.candidate_generator import EarlyExitCandidateGenerator

    root, prompts = searched
    report = json.loads((root / "search.json").read_text())
    out = tmp_path / "out"
    assert export_main(["--ckpt", str(root / "hf"), "--out", str(out), "--format", "hf", "--draft-from",
                        str(root / "search.json"), "--no-tokenizer"]) == 0
    assert f"exit draft {report['best_exit']['exit_layer']}" in capsys.readouterr().out
    model = AutoModelForCausalLM.from_pretrained(out).eval()
    config = model.generation_config
    assert config.assistant_early_exit == report["best_exit"]["exit_layer"]
    assert (config.num_assistant_tokens, config.num_assistant_tokens_schedule) == (3, "constant")
    drafted = []
    real = EarlyExitCandidateGenerator.get_candidates

    def counted(self, *args, **kwargs):
        drafted.append(self.assistant_early_exit)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(EarlyExitCandidateGenerator, "get_candidates", counted)
    for prompt in prompts:
        ids = torch.tensor([prompt])
        with torch.no_grad():
            speculative = model.generate(ids, max_new_tokens=12, min_new_tokens=12)
            plain = model.generate(ids, max_new_tokens=12, min_new_tokens=12, assistant_early_exit=None)
        assert speculative.tolist() == plain.tolist()
    assert drafted and set(drafted) == {report["best_exit"]["exit_layer"]}


def report_with(root, tmp_path, **changes):
    report = json.loads((root / "search.json").read_text())
    for key, value in changes.items():
        if key.startswith("best_exit."):
            report["best_exit"][key.split(".", 1)[1]] = value
        else:
            report[key] = value
    path = tmp_path / "report.json"
    path.write_text(json.dumps(report))
    return path


@pytest.mark.parametrize("change,message", [
    ({"num_layers": 6}, "searched on a model of 6 layers, this one has 4"),
    ({"best_exit.exit_layer": 4}, "best_exit.exit_layer=4 is invalid: an exit in 1..3"),
    ({"best_exit.exit_layer": True}, "best_exit.exit_layer=True is invalid"),
    ({"gamma": 0}, "gamma=0 is invalid"),
    ({"best_exit.identical_to_greedy": False}, "was not lossless"),
    ({"best_exit": None}, "has no best_exit"),
])
def test_a_report_that_does_not_fit_is_refused_in_one_line_before_anything_is_written(
        searched, tmp_path, capsys, change, message):
    root, _ = searched
    path = report_with(root, tmp_path, **change)
    out = tmp_path / "out"
    assert export_main(["--ckpt", str(root / "hf"), "--out", str(out), "--format", "hf", "--draft-from",
                        str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --draft-from") and message in err[0], err
    assert not out.exists()


def test_draft_from_needs_the_hf_format_and_a_report(searched, tmp_path, capsys):
    root, _ = searched
    for args, message in ((["--draft-from", str(root / "search.json")], "needs --format hf"),
                          (["--draft-from", str(tmp_path / "none.json"), "--format", "hf"], "does not exist"),
                          (["--draft-from", str(root / "prompts.json"), "--format", "hf"], "has no best_exit")):
        assert export_main(["--ckpt", str(root / "hf"), "--out", str(tmp_path / "out"), *args]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], err
    assert not (tmp_path / "out").exists()

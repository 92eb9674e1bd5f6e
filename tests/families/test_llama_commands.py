"""Every post-training command on a Hugging Face folder passed as ``--ckpt``: generate
in every mode, exit adapters fit, speculative search and run, eval exits."""

from __future__ import annotations

import json
import shutil

import pytest

from framework.cli import main as layerdrop
from tests.helpers.hf_llama import tiny_hf_llama


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory, prepared_tokens):
    folder = tmp_path_factory.mktemp("imported") / "hf"
    tiny_hf_llama(folder, vocab=300, tie=True)
    shutil.copy(prepared_tokens / "tokenizer.json", folder / "tokenizer.json")
    return folder


@pytest.fixture(scope="module")
def adapters(hf_dir, prepared_tokens, tmp_path_factory):
    out = tmp_path_factory.mktemp("adapters") / "a"
    assert layerdrop(["adapters", "fit", "--ckpt", str(hf_dir), "--data", str(prepared_tokens), "--out", str(out),
                          "--exits", "2", "--max-steps", "4", "--batch-size", "4", "--seq-len", "32"]) == 0
    return out


@pytest.mark.parametrize("mode", ["full", "exit:2", "skip:1,2", "speculative", "dynamic", "adapter"])
def test_generate_runs_every_mode_on_an_hf_folder(hf_dir, adapters, mode, capsys):
    args = ["--ckpt", str(hf_dir), "--prompt", "def main(", "--max-new-tokens", "6"]
    if mode == "adapter":
        args += ["--mode", "speculative", "--draft", "adapter:2", "--adapters", str(adapters)]
    else:
        args += ["--mode", mode] + (["--threshold", "0.5"] if mode == "dynamic" else [])
    assert layerdrop(["generate", *args]) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith("def main(") and "tokens/s" in captured.err


def test_speculative_run_and_search_on_an_hf_folder(hf_dir, prepared_tokens, tmp_path):
    assert layerdrop(["speculate", "run", "--ckpt", str(hf_dir), "--data", str(prepared_tokens), "--num-prompts", "2",
                           "--skip-layers", "1,2", "--max-new-tokens", "6", "--out", str(tmp_path / "run.json")]) == 0
    report = json.loads((tmp_path / "run.json").read_text())
    assert report["identical_to_greedy"] is True and report["skip_layers"] == [1, 2]
    assert layerdrop(["speculate", "search", "--ckpt", str(hf_dir), "--data", str(prepared_tokens), "--methods",
                           "hill_climbing", "--budget", "3", "--calibration-prompts", "1", "--confirm-prompts", "1",
                           "--max-new-tokens", "6", "--out", str(tmp_path / "search.json")]) == 0


def test_eval_exits_on_an_hf_folder(hf_dir, prepared_tokens, tmp_path):
    assert layerdrop(["eval", "exits", "--ckpt", str(hf_dir), "--data", str(prepared_tokens), "--seq-len", "32", "--batches", "1",
                       "--batch-size", "2", "--out", str(tmp_path / "exits.json")]) == 0
    report = json.loads((tmp_path / "exits.json").read_text())
    assert report["num_layers"] == 4 and set(report["exit_loss"]) == {"1", "2", "3", "4"}

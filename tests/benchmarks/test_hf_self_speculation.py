"""benchmarks/hf_self_speculation.py at a tiny size, run as a user runs it: the search, the export with
its draft, transformers' generate with and without it and layerdrop's own exit draft on the same prompts;
both sides lossless and the same greedy tokens (the same model)."""

from __future__ import annotations

import json
import subprocess
import sys
import sysconfig
from pathlib import Path

from data_prep.prepare import main as prepare_main
from harness import REPO
from tests.helpers.hf_llama import tiny_hf_llama
from tests.helpers.hf_tokenizer import llama3_tokenizer


def test_the_benchmark_compares_both_sides_on_the_same_prompts(tmp_path):
    hf = tmp_path / "hf"
    tiny_hf_llama(hf, vocab=300, layers=4, tie=True)
    llama3_tokenizer(hf / "tokenizer.json")
    corpus = str(Path(sysconfig.get_paths()["stdlib"]) / "json" / "*.py")
    assert prepare_main(["--files", corpus, "--tokenizer", str(hf / "tokenizer.json"), "--out", str(tmp_path / "data"),
                         "--val-fraction", "0.3", "--chunk-tokens", "4096", "--workers", "1", "--no-progress"]) == 0
    out = tmp_path / "result.json"
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "hf_self_speculation.py"), "--ckpt", str(hf),
                           "--data", str(tmp_path / "data"), "--prompts", "2", "--prompt-len", "8",
                           "--max-new-tokens", "6", "--repeats", "1", "--search-budget", "3", "--out", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["transformers"]["identical_to_greedy"] is True and result["layerdrop"]["identical_to_greedy"] is True
    assert result["same_greedy_tokens_both_sides"] is True
    assert result["transformers"]["exit"] == result["exit"] == result["search_best_exit"]["exit_layer"]
    assert result["transformers"]["speedup"] > 0 and result["layerdrop"]["speedup"] > 0
    assert "| transformers generate" in done.stdout

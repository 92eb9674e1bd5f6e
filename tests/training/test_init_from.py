"""Continued pretraining (``model.init_from``) and its tokens: data prepared with another
tokenizer than the model's is refused before any step, and the BOS/EOS of a Hugging
Face folder survive HF -> prepare -> continued pretraining -> export --format hf."""

from __future__ import annotations

import json
import sysconfig
from pathlib import Path

import pytest

from data_prep.prepare import main as prepare_main
from framework.checkpoint import Checkpoint
from framework.checkpoint.export import main as export_main
from framework.tokenizer import TextCodec
from framework.training.pretrain import main as pretrain_main
from tests.families.test_llama_continued import cpu_args
from tests.helpers.checkpoint_run import count_checkpoint_opens
from tests.helpers.hf_llama import tiny_hf_llama
from tests.helpers.hf_tokenizer import llama3_tokenizer


@pytest.fixture(scope="module")
def llama3_run(tmp_path_factory):
    """An HF Llama folder with a Llama-3-like tokenizer, and data prepared with that tokenizer."""
    root = tmp_path_factory.mktemp("llama3")
    hf = root / "hf"
    tiny_hf_llama(hf, vocab=300, layers=2, tie=True)
    llama3_tokenizer(hf / "tokenizer.json")
    config = json.loads((hf / "config.json").read_text())
    (hf / "config.json").write_text(json.dumps({**config, "bos_token_id": 0, "eos_token_id": [1, 3]}))
    corpus = str(Path(sysconfig.get_paths()["stdlib"]) / "json" / "*.py")
    data = root / "data"
    assert prepare_main(["--files", corpus, "--tokenizer", str(hf / "tokenizer.json"), "--out", str(data),
                         "--val-fraction", "0.3", "--chunk-tokens", "4096", "--workers", "1", "--no-progress"]) == 0
    return hf, data


def test_data_of_another_tokenizer_is_refused_before_any_step(llama3_run, prepared_tokens, tmp_path, capsys):
    """Same vocabulary size (300), other tokens: it used to train without a word."""
    hf, _ = llama3_run
    root = tmp_path / "run"
    assert pretrain_main(cpu_args(hf, prepared_tokens, root, steps=2)) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and str(prepared_tokens / "tokenizer.json") in lines[0] and str(hf) in lines[0]
    assert not list(root.rglob("*.ckpt")) and not (root / "export").exists()


def test_bos_and_eos_survive_continued_pretraining_and_export(llama3_run, tmp_path, capsys, monkeypatch):
    """And each command opens its checkpoint once: pretrain reads the folder's config, checks
    its model and tokenizer and copies its weights from one opened Checkpoint."""
    hf, data = llama3_run
    root = tmp_path / "run"
    assert json.loads((data / "manifest.json").read_text())["tokenizer"]["document_start"] == "bos"
    opened = count_checkpoint_opens(monkeypatch)
    assert pretrain_main(cpu_args(hf, data, root, steps=2, p_max=0.2)) == 0
    assert opened == [hf]
    out = tmp_path / "hf-out"
    opened.clear()
    assert export_main(["--ckpt", str(root / "export"), "--out", str(out), "--format", "hf"]) == 0
    assert opened == [root / "export"]
    config = json.loads((out / "config.json").read_text())
    assert (config["bos_token_id"], config["eos_token_id"]) == (0, [1, 3])  # Llama-3.x-Instruct's list too
    assert TextCodec.for_checkpoint(Checkpoint.open(root / "export")).stop_ids == (1, 3)
    last = Checkpoint.open(root / "checkpoints" / "last.ckpt")
    assert TextCodec.for_checkpoint(last).encode_prompt("x")[0] == 0  # BOS
    tokens = json.loads((out / "tokenizer_config.json").read_text())
    assert (tokens["bos_token"], tokens["eos_token"]) == ("<|begin_of_text|>", "<|end_of_text|>")

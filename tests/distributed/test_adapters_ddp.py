"""`layerdrop adapters fit` on 2 CPU processes (DDP over gloo): every rank holds the
frozen backbone, only the adapters' gradients are all-reduced, and the adapters come
out as a single-process run's at the same global batch.

"The same global batch" is made exact by the data: its train split holds exactly
8 sequences, so every step of either run is the whole split (2 ranks x 4 sequences,
or 1 x 8; litdata only changes their order), and the mean KL over the global batch
has the same gradient whichever way it is split.
"""

from __future__ import annotations

import json
import sys
import sysconfig
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from pretrain_launch import run

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(600)]

GLOBAL_BATCH, STEPS = 8, 6


@pytest.fixture(scope="module")
def eight_sequences(tiny_data: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    """A prepared folder whose train split is exactly 8 sequences of seq_len + 1 tokens."""
    out = tmp_path_factory.mktemp("adapters-ddp")
    source = Path(sysconfig.get_paths()["stdlib"]) / "json" / "decoder.py"
    paragraphs = [p for p in source.read_text().split("\n\n") if p.strip()]
    (out / "docs.jsonl").write_text("".join(json.dumps({"text": p}) + "\n" for p in paragraphs))
    from data_prep.prepare import main as prepare

    assert prepare(["--jsonl", str(out / "docs.jsonl"), "--tokenizer", str(tiny_data / "tokenizer.json"),
                    "--max-tokens", "700", "--val-fraction", "0.3", "--workers", "1", "--no-progress",
                    "--out", str(out / "data")]) == 0
    train_tokens = json.loads((out / "data" / "manifest.json").read_text())["splits"]["train"]["tokens"]
    seq_len = train_tokens // GLOBAL_BATCH - 1
    assert train_tokens // (seq_len + 1) == GLOBAL_BATCH and 8 <= seq_len <= 64, train_tokens
    return out / "data", seq_len


@pytest.fixture(scope="module")
def backbone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from framework.checkpoint import export_decoder
    from framework.config import ModelConfig
    from framework.model.decoder import Decoder

    torch.manual_seed(0)
    model = Decoder(ModelConfig(vocab_size=512, d_model=32, n_layers=4, n_heads=4, max_seq_len=64, attention="sdpa"))
    return export_decoder(model.eval(), tmp_path_factory.mktemp("adapters-ddp") / "backbone")


def _arguments(backbone: Path, data: Path, seq_len: int, out: Path, *extra: str) -> list[str]:
    return ["--ckpt", str(backbone), "--data", str(data), "--out", str(out), "--exits", "1,2", "--max-steps",
            str(STEPS), "--seq-len", str(seq_len), "--lr", "1e-2", "--accelerator", "cpu", "--val-batches", "1",
            *extra]


def test_ddp_adapters_equal_a_single_process_run_at_the_same_global_batch(backbone, eight_sequences, tmp_path):
    from eval.adapters.fit import fit_main

    data, seq_len = eight_sequences
    # Lightning starts the second rank by running the same command again: a real CLI process.
    run([sys.executable, "-m", "framework.cli", "adapters", "fit",
         *_arguments(backbone, data, seq_len, tmp_path / "ddp", "--devices", "2", "--batch-size", "4")],
        tmp_path / "ddp.log")
    log = (tmp_path / "ddp.log").read_text()
    assert "Starting with 2 processes" in log and "distributed_backend=gloo" in log  # DDP, chosen by "auto"
    assert fit_main(_arguments(backbone, data, seq_len, tmp_path / "single", "--batch-size", str(GLOBAL_BATCH))) == 0
    ddp, single = (load_file(str(tmp_path / name / "adapters.safetensors")) for name in ("ddp", "single"))
    assert ddp.keys() == single.keys()
    for name in single:
        torch.testing.assert_close(ddp[name], single[name], rtol=1e-5, atol=1e-6, msg=name)
    # ... and they did train: far from their start, a copy of the backbone's last block.
    start = load_file(str(backbone / "model.safetensors"))
    moved = max(float((single[name] - start[f"blocks.3.{name.split('.', 2)[2]}"]).abs().max()) for name in single)
    assert moved > 1e-2

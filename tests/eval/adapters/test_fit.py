"""`adapters fit`: the KL objective against a slow reference, a frozen backbone, and the
command end to end (then `adapters eval` on what it wrote).

The end-to-end test takes the suite's prepared tokens (tests/conftest.py), trains a
small backbone briefly with a plain loop, then runs `adapters fit` (Lightning
Trainer) and `adapters eval` on it.
"""

from __future__ import annotations

import json

import lightning.pytorch as pl
import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from eval.adapters.evaluation import eval_main
from eval.adapters.fit import AdapterModule, chunked_distillation_kl, distillation_kl, fit_main
from framework.console.progress_line import parse_progress_line
from tests.eval.adapters.backbones import SEQ_LEN, random_backbone


def test_kl_matches_a_slow_reference():
    torch.manual_seed(0)
    student, teacher = torch.randn(2, 5, 11), torch.randn(2, 5, 11)
    teacher_logp = F.log_softmax(teacher, -1)
    slow = 0.0
    for b in range(2):
        for t in range(5):
            p = teacher_logp[b, t].exp()
            q = F.softmax(student[b, t], -1)
            slow += float((p * (p.log() - q.log())).sum())
    assert float(distillation_kl(student, teacher_logp)) == pytest.approx(slow / 10, rel=1e-5)
    assert float(distillation_kl(teacher, teacher_logp)) == pytest.approx(0.0, abs=1e-6)


def test_chunked_kl_equals_the_whole_batch_kl_with_the_same_gradients():
    backbone = random_backbone()
    torch.manual_seed(1)
    student = torch.randn(3, 7, 64, requires_grad=True)
    teacher = torch.randn(3, 7, 64)
    whole = distillation_kl(backbone.logits(student), F.log_softmax(backbone.logits(teacher), -1))
    (grad_whole,) = torch.autograd.grad(whole, student)
    chunked = chunked_distillation_kl(student, teacher, backbone.logits, chunk_tokens=4)
    (grad_chunked,) = torch.autograd.grad(chunked, student)
    assert float(chunked) == pytest.approx(float(whole), rel=1e-5)
    assert torch.allclose(grad_chunked, grad_whole, atol=1e-7)


def test_training_leaves_the_backbone_bit_identical():
    backbone = random_backbone()
    before = {k: v.clone() for k, v in backbone.state_dict().items()}
    module = AdapterModule(backbone, [1, 2], lr=1e-2)
    adapter_before = module.adapters.blocks["1"].ffn.up.weight.detach().clone()
    tokens = torch.randint(0, 97, (16, 17))
    batches = DataLoader(TensorDataset(tokens[:, :-1], tokens[:, 1:]), batch_size=4)
    trainer = pl.Trainer(accelerator="cpu", max_steps=4, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0)
    trainer.fit(module, train_dataloaders=batches)
    assert all(not p.requires_grad for p in backbone.parameters())
    optimised = {id(p) for group in trainer.optimizers[0].param_groups for p in group["params"]}
    assert optimised == {id(p) for p in module.adapters.parameters()}
    for key, value in backbone.state_dict().items():
        assert torch.equal(value, before[key]), key
    assert not torch.equal(module.adapters.blocks["1"].ffn.up.weight, adapter_before)  # it did train


def test_fit_then_eval_reduces_the_exit_loss(prepared, backbone_dir, tmp_path, capsys, monkeypatch):
    out = tmp_path / "adapters"
    assert fit_main(["--ckpt", str(backbone_dir), "--data", str(prepared), "--out", str(out), "--exits", "1,2",
                     "--max-steps", "20", "--batch-size", "8", "--seq-len", str(SEQ_LEN), "--lr", "2e-3",
                     "--accelerator", "cpu", "--val-batches", "2"]) == 0
    shown = capsys.readouterr().out.splitlines()  # not a terminal: step lines, not "Epoch 0/-2"
    steps = [line.step for line in map(parse_progress_line, shown) if line]
    assert steps[0] == 1 and steps[-1] == 20 and all(line.total == 20 for line in map(parse_progress_line, shown)
                                                      if line)
    assert not [line for line in shown if "Epoch" in line]
    meta = json.loads((out / "adapters.json").read_text())
    assert meta["exits"] == [1, 2] and meta["backbone"] == str(backbone_dir.resolve())
    saved = set(__import__("safetensors.torch", fromlist=["load_file"]).load_file(out / "adapters.safetensors"))
    assert saved and all(k.startswith("blocks.1.") or k.startswith("blocks.2.") for k in saved)  # adapters only

    report_path = tmp_path / "report.json"
    monkeypatch.setattr("framework.console.loop_progress.LOG_EVERY", 0.0)  # a line per batch
    assert eval_main(["--adapters", str(out), "--data", str(prepared), "--out", str(report_path),
                      "--seq-len", str(SEQ_LEN), "--batches", "6"]) == 0
    printed = capsys.readouterr()
    counted = [line.split(" in ")[0] for line in printed.err.splitlines() if "batches:" in line]
    assert counted == [f"adapters eval: {what}, batches: {n}/6 ({n / 6:.0%})"  # each pass counts its 6
                       for what in ("plain exits", "adapters") for n in range(1, 7)]
    report = json.loads(report_path.read_text())
    assert (tmp_path / "report.png").stat().st_size > 0
    final = report["final_loss"]
    for e in ("1", "2"):
        # The objective: the adapter exit is far closer to the full model than the plain exit ...
        assert report["adapter_kl"][e] < 0.5 * report["plain_kl"][e], report
        # ... and so is its cross-entropy, which moves from the plain exit's toward the full model's.
        assert abs(report["adapter_loss"][e] - final) < abs(report["plain_loss"][e] - final), report
    assert report["exit_loss"]["4"] == final and report["num_layers"] == 4
    assert "exit 1: plain" in printed.out


def test_fit_in_a_log_shows_steps_and_no_library_noise(prepared, backbone_dir, tmp_path):
    """As a user runs it (a subprocess, stdout a pipe): no "Epoch 0/-2", no Lightning
    advertisement, no warning about code the user does not own."""
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-m", "framework.cli", "adapters", "fit", "--ckpt", str(backbone_dir),
                             "--data", str(prepared), "--out", str(tmp_path / "a"), "--max-steps", "2",
                             "--batch-size", "2", "--seq-len", str(SEQ_LEN), "--accelerator", "cpu",
                             "--val-batches", "1"], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    output = result.stdout + result.stderr
    for noise in ("Epoch 0/-2", "Tip:", "litlogger", "LeafSpec", "IterableDataset", "in eval mode"):
        assert noise not in output, output
    assert [line.step for line in map(parse_progress_line, result.stdout.splitlines()) if line] == [1, 2]


def test_fit_refuses_bad_input_before_training(prepared, backbone_dir, tmp_path, capsys):
    base = ["--data", str(prepared), "--out", str(tmp_path / "a")]
    cases = [
        (["--ckpt", str(tmp_path / "missing")], "does not exist"),
        (["--ckpt", str(backbone_dir), "--exits", "0,2"], "exits=[0, 2] is invalid"),
        (["--ckpt", str(backbone_dir), "--exits", "4"], "exits=[4] is invalid"),
        (["--ckpt", str(backbone_dir), "--max-steps", "0"], "--max-steps=0 is invalid"),
        (["--ckpt", str(backbone_dir), "--strategy", "fsdp"], "invalid choice"),
    ]
    for args, message in cases:
        with pytest.raises(SystemExit) as exit_info:
            fit_main(base + args)
        assert exit_info.value.code == 2
        assert message in capsys.readouterr().err
    assert not (tmp_path / "a" / "adapters.safetensors").exists()

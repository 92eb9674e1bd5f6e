"""Continued pretraining of an imported Hugging Face Llama on 2 CPU processes with
FSDP2 (recipes/llama-continued.yaml with activation checkpointing on, ILD+DTS): every rank
loads its shards from the folder, and the run lowers the model's loss."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from framework.checkpoint import load_decoder
from tests.helpers.hf_llama import heldout_tokens, loss_of, tiny_hf_llama
from pretrain_launch import REPO, pretrain_command, run

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(600)]


def test_fsdp2_continued_pretraining_from_an_hf_folder(tmp_path, tiny_data):
    hf_dir = tmp_path / "hf"
    tiny_hf_llama(hf_dir, vocab=300, tie=True, layers=3)
    shutil.copy(tiny_data / "tokenizer.json", hf_dir / "tokenizer.json")
    steps = 10
    run(pretrain_command(REPO / "recipes" / "llama-continued.yaml", "--model.init_from", str(hf_dir),
                         "--data.data_dir", str(tiny_data), "--trainer.default_root_dir", str(tmp_path / "run"),
                         "--trainer.accelerator", "cpu", "--trainer.devices", "2", "--trainer.precision", "32-true",
                         "--trainer.max_steps", str(steps), "--trainer.val_check_interval", str(steps),
                         "--model.activation_checkpointing", "true",
                         "--trainer.limit_val_batches", "2", "--trainer.enable_progress_bar", "false",
                         "--trainer.enable_model_summary", "false", "--model.layer_dropout.p_max", "0.4",
                         "--model.parametrization.lr", "3e-3", "--model.lr_schedule.warmup_steps", "1",
                         "--data.seq_len", "32", "--data.batch_size", "4", "--data.num_workers", "0",
                         "--data.val_batches", "2", "--checkpoint.every_n_steps", str(steps)),
        tmp_path / "log.txt")
    original, _ = load_decoder(hf_dir)
    trained, cfg = load_decoder(tmp_path / "run" / "export")
    assert cfg.tie_embeddings and trained.head.weight is trained.embed.weight
    tokens = heldout_tokens(tiny_data)
    with torch.no_grad():
        assert loss_of(trained(tokens), tokens) < loss_of(original(tokens), tokens) - 0.3
        cosine = torch.nn.functional.cosine_similarity(original.embed.weight.flatten(),
                                                       trained.embed.weight.flatten(), 0)
        assert cosine > 0.8  # it started from the folder's weights

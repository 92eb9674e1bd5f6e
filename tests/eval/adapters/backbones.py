"""Backbones of the adapter tests: a random one for the units, a briefly trained one
(exported) for the commands end to end."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

from framework.checkpoint import export_decoder
from framework.config import ModelConfig
from framework.model.decoder import Decoder

SEQ_LEN = 32


def small_config(vocab: int = 300) -> ModelConfig:
    return ModelConfig(vocab_size=vocab, d_model=64, n_layers=4, n_heads=2, max_seq_len=SEQ_LEN, attention="sdpa")


def random_backbone(seed: int = 0) -> Decoder:
    torch.manual_seed(seed)
    return Decoder(small_config(vocab=97)).eval()


def trained_backbone(prepared: Path, out: Path) -> Path:
    """A backbone trained for a short while with a plain loop on the prepared tokens (30
    steps leave the plain exits' KL ~100 times what 20 adapter steps bring it to)."""
    from framework.training.data import TokenDataModule

    torch.manual_seed(0)
    model = Decoder(small_config())
    data = TokenDataModule(str(prepared), seq_len=SEQ_LEN, batch_size=16, seed=0)
    data.setup("fit")
    steps = 30
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 16) * (1 - s / steps))
    done = 0
    while done < steps:
        for inputs, targets in data.train_dataloader():
            loss = F.cross_entropy(model(inputs).flatten(0, 1), targets.flatten())
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()
            done += 1
            if done == steps:
                break
    export_decoder(model.eval(), out)
    return out

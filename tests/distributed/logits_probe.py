"""Test-only callback: the trained model's logits on fixed tokens, computed by the live
(sharded) model at the end of training and saved by global rank 0, so a test can
check that a checkpoint loads to the very function that was trained.

Every rank runs the same forward (FSDP2 and ZeRO-3 all-gather inside it)."""

from __future__ import annotations

import lightning.pytorch as pl
import torch


class LogitsProbe(pl.Callback):
    def __init__(self, out: str, batch: int = 2, length: int = 16) -> None:
        self.out, self.batch, self.length = out, batch, length

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        model = pl_module.model
        generator = torch.Generator().manual_seed(0)
        tokens = torch.randint(0, pl_module.model_cfg.vocab_size, (self.batch, self.length), generator=generator)
        was_training = model.training
        model.eval()
        with torch.no_grad():
            logits = model(tokens.to(trainer.strategy.root_device))
        model.train(was_training)
        if trainer.is_global_zero:
            torch.save({"tokens": tokens, "logits": logits.detach().float().cpu()}, self.out)

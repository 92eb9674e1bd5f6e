"""The non-finite-loss guard: a NaN loss stops the run and no checkpoint of that
state is written."""

from __future__ import annotations

import pytest
import torch

from framework.checkpointing import PeriodicCheckpoint
from framework.nonfinite import NonFiniteLossError
from tiny_training import RandomTokens, quiet_trainer, tiny_module


class PoisonedModule(type(tiny_module())):
    """Returns a NaN loss from optimizer step ``bad_step`` on."""

    bad_step = 3

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        return loss * float("nan") if self.trainer.global_step >= self.bad_step else loss


def test_nan_loss_stops_the_run_and_keeps_the_last_good_checkpoint(tmp_path):
    torch.manual_seed(0)
    module = tiny_module()
    module.__class__ = PoisonedModule
    checkpoint = PeriodicCheckpoint(every_n_steps=1, keep_last=2, dirpath=str(tmp_path))
    trainer = quiet_trainer(max_steps=6, callbacks=[checkpoint], enable_checkpointing=True)
    with pytest.raises(NonFiniteLossError, match=r"training loss is nan at step 3 .*last.ckpt"):
        trainer.fit(module, RandomTokens())
    saved = torch.load(tmp_path / "last.ckpt", weights_only=True)
    assert saved["global_step"] == 3
    assert all(torch.isfinite(t).all() for t in saved["state_dict"].values())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt", "step-00000002.ckpt", "step-00000003.ckpt"]

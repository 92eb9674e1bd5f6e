"""Non-finite training: skipped steps (no update), the stop after too many in a row
naming a finite checkpoint from before them, and no checkpoint ever holding a NaN/Inf.
The issue's divergence (an LR that blows up) is reproduced end to end through
`layerdrop pretrain`, then resumed with a lower LR."""

from __future__ import annotations

import math
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch

from framework.training.checkpointing.saving import PeriodicCheckpoint
from framework.training.nonfinite import NonFiniteLossError, NonFiniteLossGuard
from tests.helpers.step_records import callbacks_arg, records
from tests.helpers.tiny_training import KeepingLogger, RandomTokens, quiet_trainer, tiny_module


def poison_loss(module: pl.LightningModule, bad_steps: set[int] | None = None, from_step: int | None = None) -> None:
    """Make ``module.training_step`` return a NaN loss at the given optimizer steps."""
    step_fn = module.training_step

    def training_step(batch, batch_idx):
        out = step_fn(batch, batch_idx)
        step = module.trainer.global_step
        if (bad_steps and step in bad_steps) or (from_step is not None and step >= from_step):
            return {**out, "loss": out["loss"] * float("nan")} if isinstance(out, dict) else out * float("nan")
        return out

    module.training_step = training_step


class Weights(pl.Callback):
    """The flattened parameters after every optimizer step, and the optimizer's step count."""

    def __init__(self) -> None:
        self.after: dict[int, torch.Tensor] = {}

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.after[trainer.global_step - 1] = torch.cat([p.detach().flatten() for p in pl_module.parameters()]).clone()


def all_finite(path: Path) -> bool:
    saved = torch.load(path, weights_only=True)
    tensors = list(saved["state_dict"].values())
    for state in saved["optimizer_states"]:
        tensors += [v for entry in state["state"].values() for v in entry.values() if torch.is_tensor(v)]
    return all(bool(torch.isfinite(t).all()) for t in tensors if t.is_floating_point())


def test_a_non_finite_step_is_skipped_and_training_goes_on(capsys):
    torch.manual_seed(0)
    module, weights, logger = tiny_module(), Weights(), KeepingLogger()
    poison_loss(module, bad_steps={2})
    trainer = quiet_trainer(max_steps=5, callbacks=[weights], logger=logger)
    trainer.fit(module, RandomTokens())
    assert trainer.global_step == 5  # the skipped step still counts: the data and the schedule move on
    assert torch.equal(weights.after[2], weights.after[1])  # no update at step 2 ...
    assert all(not torch.equal(weights.after[s], weights.after[s - 1]) for s in (1, 3, 4))  # ... at every other
    adam_steps = {float(s["step"]) for s in trainer.optimizers[0].state.values()}
    assert adam_steps == {4.0}  # AdamW's moments did not move either
    assert logger.metrics["nonfinite/skipped_steps"] == [(2, 1.0)]
    err = capsys.readouterr().err
    assert "step 2 (batch 2): non-finite loss and non-finite gradient norm; skipped, no optimizer update" in err


def test_a_save_due_at_a_skipped_step_waits_for_the_next_good_one(tmp_path, capsys):
    torch.manual_seed(0)
    module = tiny_module()
    poison_loss(module, bad_steps={1})
    checkpoint = PeriodicCheckpoint(every_n_steps=2, keep_last=5, dirpath=str(tmp_path))
    trainer = quiet_trainer(max_steps=6, callbacks=[checkpoint], enable_checkpointing=True)
    trainer.fit(module, RandomTokens())
    # Due after step 1, which was skipped: written after step 2, which went through.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt", "step-00000003.ckpt", "step-00000004.ckpt",
                                                          "step-00000006.ckpt"]
    assert "step 2: the checkpoint waits for a step without non-finite values" in capsys.readouterr().err


def test_an_infinite_gradient_alone_is_skipped(capsys):
    class InfiniteGradient(pl.Callback):
        def on_after_backward(self, trainer, pl_module):
            if trainer.global_step == 1:
                next(pl_module.parameters()).grad.view(-1)[0] = float("inf")

    torch.manual_seed(0)
    weights = Weights()
    trainer = quiet_trainer(max_steps=3, callbacks=[InfiniteGradient(), weights])
    trainer.fit(tiny_module(), RandomTokens())
    assert torch.equal(weights.after[1], weights.after[0])
    assert "step 1 (batch 1): non-finite gradient norm; skipped" in capsys.readouterr().err


def test_too_many_in_a_row_stop_the_run_naming_a_finite_checkpoint_from_before(tmp_path):
    torch.manual_seed(0)
    module = tiny_module()
    poison_loss(module, from_step=3)
    checkpoint = PeriodicCheckpoint(every_n_steps=1, keep_last=2, dirpath=str(tmp_path))
    trainer = quiet_trainer(max_steps=8, callbacks=[checkpoint, NonFiniteLossGuard(max_consecutive_nonfinite=2)],
                            enable_checkpointing=True, accumulate_grad_batches=2)
    with pytest.raises(NonFiniteLossError) as stop:
        trainer.fit(module, RandomTokens())
    message = str(stop.value)
    assert message.startswith("2 steps in a row were skipped for non-finite values, the limit of "
                              "guard.max_consecutive_nonfinite (steps 3..4; the last, batch 9:")
    assert "micro-batch" not in message
    # Step 3's checkpoint holds the weights that went non-finite at step 3: the one named predates them.
    assert f"is {tmp_path / 'step-00000002.ckpt'}: resume from it with a lower learning rate" in message
    # Nothing was saved while steps were being skipped, so the keep-last window still holds them.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt", "step-00000002.ckpt", "step-00000003.ckpt"]
    assert all(all_finite(tmp_path / name) for name in ("step-00000002.ckpt", "step-00000003.ckpt"))


def test_a_state_holding_a_nan_is_never_saved(tmp_path):
    class Overflow(pl.Callback):  # runs before the checkpoint callback at the end of a step
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if trainer.global_step == 2:
                with torch.no_grad():
                    pl_module.model.blocks[0].ffn.up.weight.view(-1)[3] = float("nan")

    torch.manual_seed(0)
    checkpoint = PeriodicCheckpoint(every_n_steps=1, keep_last=3, dirpath=str(tmp_path))
    trainer = quiet_trainer(max_steps=4, callbacks=[Overflow(), checkpoint], enable_checkpointing=True)
    with pytest.raises(NonFiniteLossError, match=r"the state at step 2 holds 1 non-finite tensor "
                                                 r"\(model\.blocks\.0\.ffn\.up\.weight\); it was not saved"):
        trainer.fit(tiny_module(), RandomTokens())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt", "step-00000001.ckpt"]


def test_a_checkpoint_holding_a_nan_is_not_resumed(tmp_path):
    torch.manual_seed(0)
    trainer = quiet_trainer(max_steps=2, callbacks=[PeriodicCheckpoint(every_n_steps=2, dirpath=str(tmp_path))],
                            enable_checkpointing=True)
    trainer.fit(tiny_module(), RandomTokens())
    poisoned = tmp_path / "poisoned.ckpt"  # as an earlier version of this code could write
    saved = torch.load(tmp_path / "step-00000002.ckpt", weights_only=True)
    next(iter(saved["optimizer_states"][0]["state"].values()))["exp_avg_sq"].view(-1)[0] = float("inf")
    torch.save(saved, poisoned)
    trainer = quiet_trainer(max_steps=4, callbacks=[PeriodicCheckpoint(dirpath=str(tmp_path / "again"))],
                            enable_checkpointing=True)
    with pytest.raises(NonFiniteLossError, match=r"checkpoint '.*poisoned.ckpt' holds 1 non-finite tensor "
                                                 r"\(.*\(optimizer exp_avg_sq\)\); it cannot be resumed"):
        trainer.fit(tiny_module(), RandomTokens(), ckpt_path=str(poisoned))


@pytest.mark.parametrize("value", [0, -1, 2.5, True])
def test_the_limit_is_checked(value):
    with pytest.raises(ValueError, match=f"guard.max_consecutive_nonfinite={value!r} is invalid"):
        NonFiniteLossGuard(max_consecutive_nonfinite=value)


# ----------------------------------------------- the divergence, end to end


def test_a_diverging_run_stops_with_finite_checkpoints_and_resumes_at_a_lower_lr(prepared_tokens, tmp_path, capsys):
    from framework.training.pretrain import main
    from tests.helpers.tiny_training import tiny_cli_args

    data = prepared_tokens
    root, log = tmp_path / "run", tmp_path / "steps.jsonl"

    def args(lr: str, *extra: str) -> list[str]:
        return tiny_cli_args(data, root, steps=12) + [
            "--model.parametrization.lr", lr, "--model.lr_schedule.warmup_steps", "8",
            "--checkpoint.every_n_steps", "1", "--guard.max_consecutive_nonfinite", "3",
            "--trainer.logger", "false", "--trainer.callbacks", callbacks_arg(log), *extra]

    # An LR 300 000 times too high: the loss explodes, then turns NaN.
    assert main(args("1000")) == 1
    error = capsys.readouterr().err.strip().splitlines()[-1]
    losses = [r["loss"] for r in records(log)]
    assert losses[0] < 10 and losses[1] > 1000 and math.isnan(losses[-1])
    first_nan = next(i for i, loss in enumerate(losses) if math.isnan(loss))
    named = root / "checkpoints" / f"step-{first_nan - 1:08d}.ckpt"
    assert error.startswith("error: 3 steps in a row were skipped for non-finite values")
    assert f"from before step {first_nan}, checked finite, is {named}: resume from it" in error
    checkpoints = sorted((root / "checkpoints").glob("step-*.ckpt"))
    assert checkpoints and all(all_finite(path) for path in checkpoints)

    # The usual remedy: resume from it with a lower LR. The recipe's LR wins over the saved one.
    log.unlink()
    assert main(args("0.001", "--resume", str(named))) == 0
    out = capsys.readouterr().out
    assert f"resume: continuing from {named} (step {first_nan - 1})" in out
    assert "resume: the recipe's optimizer settings replace the checkpoint's: lr " in out
    assert "peak lr 1000 -> 0.001 (every group)" in out
    resumed = records(log)
    assert [r["step"] for r in resumed] == list(range(first_nan - 1, 12))
    assert all(math.isfinite(r["loss"]) for r in resumed)
    hidden_lrs = [r["groups"]["hidden"][0] for r in resumed]
    assert 0 < max(hidden_lrs) <= 0.001  # the lower LR on its schedule, not the saved 1000

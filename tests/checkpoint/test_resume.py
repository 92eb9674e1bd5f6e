"""Exact resume: 2N steps straight == N steps, a crash, and a resumed run (float32, CPU).

Weights, AdamW state, LR schedule, step counter and data-loader position come from the
checkpoint; the layer-dropout masks need no state (seed, rank, step, micro-batch,
layer), so every loss of the resumed steps is bit-for-bit the uninterrupted one.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest

from framework.training.pretrain import main
from framework.checkpoint.resume import choose_checkpoint, incomplete_reason
from tests.helpers.battery import hashes, layerdrop, refusal
from tests.helpers.step_records import callbacks_arg, records
from tests.helpers.tiny_training import SimulatedCrash, tiny_cli_args

N = 4


def run_args(data_dir, root, record, *extra):
    callbacks = [{"class_path": "tests.helpers.tiny_training.RecordLosses", "init_args": {"path": str(record)}}]
    return tiny_cli_args(data_dir, root, steps=2 * N, p_max=0.6) + [
        "--trainer.accumulate_grad_batches", "2", "--trainer.val_check_interval", "2",
        "--checkpoint.every_n_steps", str(N), "--trainer.logger", "false",
        "--trainer.callbacks", json.dumps(callbacks), *extra]


@pytest.mark.slow
def test_resumed_run_repeats_the_uninterrupted_losses_exactly(prepared_tokens, tmp_path, capsys):
    data_dir = prepared_tokens
    straight, resumed = tmp_path / "straight.jsonl", tmp_path / "resumed.jsonl"
    assert main(run_args(data_dir, tmp_path / "a", straight)) == 0

    crash = {"class_path": "tests.helpers.tiny_training.CrashAtStep", "init_args": {"step": N + 2}}
    with pytest.raises(SimulatedCrash):
        main(run_args(data_dir, tmp_path / "b", resumed) + ["--trainer.callbacks+", json.dumps(crash)])
    before_crash = records(resumed)
    assert max(r["step"] for r in before_crash) == N + 1  # steps N, N+1 ran and were lost
    resumed.unlink()
    assert main(run_args(data_dir, tmp_path / "b", resumed, "--resume", "auto")) == 0
    out = capsys.readouterr().out
    assert f"resume: continuing from {tmp_path / 'b' / 'checkpoints' / f'step-{N:08d}.ckpt'} (step {N})" in out
    assert "optimizer settings" not in out  # the same recipe: nothing to replace

    expected = [r for r in records(straight) if r["step"] >= N]
    got = records(resumed)
    assert [(r["step"], r["micro"]) for r in got] == [(s, m) for s in range(N, 2 * N) for m in range(2)]
    assert [r["batch"] for r in got] == [r["batch"] for r in expected]  # the loader resumed in place
    assert [r["loss"] for r in got] == [r["loss"] for r in expected]  # bit for bit
    assert [r["loss"] for r in before_crash] == [r["loss"] for r in records(straight)[: len(before_crash)]]


def test_resume_auto_without_a_checkpoint_starts_fresh(prepared_tokens, tmp_path):
    data_dir = prepared_tokens
    record = tmp_path / "losses.jsonl"
    args = tiny_cli_args(data_dir, tmp_path / "run", steps=2) + [
        "--resume", "auto", "--trainer.logger", "false",
        "--trainer.callbacks", json.dumps([{"class_path": "tests.helpers.tiny_training.RecordLosses",
                                            "init_args": {"path": str(record)}}])]
    assert main(args) == 0
    assert [r["step"] for r in records(record)] == [0, 1]


def test_a_changed_lr_schedule_and_weight_decay_take_effect_on_resume(prepared_tokens, tmp_path, capsys):
    """The recipe wins over the optimizer settings saved in the checkpoint: after the
    resume every group's LR and weight decay are those a fresh run of the new recipe
    has at the same steps."""
    data_dir = prepared_tokens

    def args(root, log, steps, *extra):
        return tiny_cli_args(data_dir, root, steps=steps) + [
            "--trainer.logger", "false", "--checkpoint.every_n_steps", "2",
            "--trainer.callbacks", callbacks_arg(log), *extra]

    new_recipe = ("--model.parametrization.lr", "0.0015", "--model.parametrization.tau_ema", "0.4",
                  "--model.lr_schedule.decay", "cosine", "--model.lr_schedule.warmup_steps", "2")
    assert main(args(tmp_path / "run", tmp_path / "first.jsonl", 4)) == 0
    capsys.readouterr()
    assert main(args(tmp_path / "run", tmp_path / "resumed.jsonl", 8, *new_recipe, "--resume", "auto")) == 0
    line = [s for s in capsys.readouterr().out.splitlines() if "optimizer settings" in s]
    assert len(line) == 1 and "peak lr 0.003 -> 0.0015 (every group)" in line[0] and "weight_decay" in line[0]
    assert main(args(tmp_path / "fresh", tmp_path / "fresh.jsonl", 8, *new_recipe)) == 0

    resumed, fresh = records(tmp_path / "resumed.jsonl"), records(tmp_path / "fresh.jsonl")
    assert [r["step"] for r in resumed] == [4, 5, 6, 7]
    assert [r["groups"] for r in resumed] == [r["groups"] for r in fresh[4:]]  # LR and weight decay, exactly
    first = records(tmp_path / "first.jsonl")
    assert first[-1]["groups"]["hidden"] != fresh[3]["groups"]["hidden"]  # they did differ


# ------------------------------------------------ which checkpoint --resume auto takes


@pytest.fixture(scope="module")
def saved_steps(tmp_path_factory):
    """Real single-file checkpoints of steps 1..4 (and last.ckpt -> step 4)."""
    import torch

    from framework.training.checkpointing.saving import PeriodicCheckpoint
    from tests.helpers.tiny_training import RandomTokens, quiet_trainer, tiny_module

    folder = tmp_path_factory.mktemp("saved") / "checkpoints"
    torch.manual_seed(0)
    trainer = quiet_trainer(max_steps=4, enable_checkpointing=True,
                            callbacks=[PeriodicCheckpoint(every_n_steps=1, keep_last=4, dirpath=str(folder))])
    trainer.fit(tiny_module(), RandomTokens())
    return folder


@pytest.fixture
def folder(saved_steps, tmp_path):
    copy = tmp_path / "checkpoints"
    shutil.copytree(saved_steps, copy, symlinks=True)
    return copy


def test_auto_takes_the_newest_complete_step_not_what_last_points_at(folder):
    os.unlink(folder / "last.ckpt")
    os.symlink("step-00000002.ckpt", folder / "last.ckpt")  # killed before last.ckpt was repointed
    choice = choose_checkpoint("auto", folder)
    assert (choice.path, choice.step) == (str(folder / "step-00000004.ckpt"), 4)
    assert choice.message(folder) == f"resume: continuing from {folder / 'step-00000004.ckpt'} (step 4)"


def test_auto_skips_a_cut_short_checkpoint_and_removes_leftovers(folder):
    data = (folder / "step-00000004.ckpt").read_bytes()
    (folder / "step-00000004.ckpt").write_bytes(data[: len(data) // 2])  # damaged outside our saves
    (folder / ".step-00000005.ckpt.staging").mkdir()
    choice = choose_checkpoint("auto", folder)
    assert choice.path == str(folder / "step-00000003.ckpt")
    assert choice.message(folder) == (
        f"resume: continuing from {folder / 'step-00000003.ckpt'} (step 3); skipped step-00000004.ckpt "
        f"(cut short at {len(data) // 2} bytes); removed 1 leftover(s) of interrupted saves "
        "(.step-00000005.ckpt.staging)")
    assert not (folder / ".step-00000005.ckpt.staging").exists()


def test_auto_reads_the_step_of_a_real_last_ckpt(folder, monkeypatch):
    from tests.helpers.checkpoint_run import count_checkpoint_opens

    for path in folder.glob("step-*.ckpt"):
        if path.name != "step-00000002.ckpt":
            path.unlink()
    os.unlink(folder / "last.ckpt")
    (folder / "last.ckpt").write_bytes((folder / "step-00000002.ckpt").read_bytes())
    (folder / "step-00000002.ckpt").unlink()
    opened = count_checkpoint_opens(monkeypatch)
    choice = choose_checkpoint("auto", folder)  # an earlier layout: last.ckpt a file of its own
    assert (choice.path, choice.step) == (str(folder / "last.ckpt"), 2)
    assert opened == [folder / "last.ckpt"]  # opened once: to read its step, then handed on


def test_auto_without_a_complete_checkpoint_starts_from_step_0(tmp_path):
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    (folder / "..step-00000003.ckpt.staging.partial-77").write_bytes(b"PK\x03\x04 half")
    choice = choose_checkpoint("auto", folder)
    assert choice.path is None
    assert choice.message(folder) == (f"resume: no complete checkpoint in {folder}, starting from step 0; removed 1 "
                                      "leftover(s) of interrupted saves (..step-00000003.ckpt.staging.partial-77)")
    assert choose_checkpoint("auto", tmp_path / "never-made").path is None


def test_a_dcp_folder_with_a_short_shard_is_incomplete(tmp_path):
    import torch
    import torch.distributed.checkpoint as dcp

    folder = tmp_path / "step-00000002.ckpt"
    dcp.save({"state_dict": {"w": torch.arange(1000.0)}}, checkpoint_id=str(folder))
    torch.save({"global_step": 2}, folder / "meta.pt")
    assert incomplete_reason(folder) is None
    shard = next(folder.glob("*.distcp"))
    size = shard.stat().st_size
    with open(shard, "r+b") as handle:
        handle.truncate(size - 100)
    assert incomplete_reason(folder) == f"shard {shard.name} holds {size - 100} of {size} bytes"
    (folder / "meta.pt").unlink()
    assert incomplete_reason(folder) == "no meta.pt"


def test_a_checkpoint_that_could_run_code_stops_the_resume_instead_of_being_skipped(folder):
    import torch

    from framework.checkpoint import CheckpointError

    torch.save({"global_step": 5, "payload": SimulatedCrash("not a tensor")}, folder / "step-00000005.ckpt")
    with pytest.raises(CheckpointError, match="step-00000005.ckpt.* is refused"):
        choose_checkpoint("auto", folder)


def test_an_explicit_path_is_checked_too(folder, tmp_path):
    data = (folder / "step-00000004.ckpt").read_bytes()
    (tmp_path / "short.ckpt").write_bytes(data[:1000])
    with pytest.raises(ValueError, match=r"checkpoint '.*short.ckpt' is incomplete: cut short at 1000 bytes"):
        choose_checkpoint(str(tmp_path / "short.ckpt"), folder)
    with pytest.raises(ValueError, match="--resume '.*nope.ckpt' is invalid: no such checkpoint"):
        choose_checkpoint(str(tmp_path / "nope.ckpt"), folder)
    assert choose_checkpoint(None, folder) is None


def test_a_deepspeed_folder_needs_every_rank_s_optimizer_file_whole(tmp_path):
    import torch

    folder = tmp_path / "step-00000030.ckpt"
    (folder / "checkpoint").mkdir(parents=True)
    (folder / "latest").write_text("checkpoint")
    torch.save({"global_step": 30}, folder / "checkpoint" / "mp_rank_00_model_states.pt")
    for rank in (0, 1):
        torch.save({"rank": rank}, folder / "checkpoint" / f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt")
    assert incomplete_reason(folder) is None
    second = folder / "checkpoint" / "zero_pp_rank_1_mp_rank_00_optim_states.pt"
    second.write_bytes(second.read_bytes()[:50])
    assert incomplete_reason(folder) == f"{second.name} cut short at 50 bytes"
    second.unlink()
    (folder / "checkpoint" / "zero_pp_rank_2_mp_rank_00_optim_states.pt").write_bytes(b"")
    assert incomplete_reason(folder) == "optimizer state files of ranks [0, 2] (expected 0..n-1)"


def test_resume_auto_with_only_damaged_checkpoints_says_what_is_damaged(prepared_tokens, tmp_path):
    """It used to answer "resume it (--resume auto)": the flag the user had passed."""
    folder = tmp_path / "run" / "checkpoints"
    folder.mkdir(parents=True)
    (folder / "step-00000003.ckpt").write_bytes(b"PK\x03\x04 cut short")
    before = hashes(folder)
    line = refusal(layerdrop("pretrain", *tiny_cli_args(prepared_tokens, tmp_path / "run", steps=2), "--resume", "auto"))
    assert "--resume auto found no complete checkpoint" in line and "step-00000003.ckpt (cut short at 14 bytes)" in line
    assert "Move them out of the folder to start from step 0" in line and "resume it (--resume auto)" not in line
    assert hashes(folder) == before


def test_a_resume_on_another_number_of_processes_is_one_line(prepared_tokens, tmp_path, capsys):
    """Losing a node: a checkpoint records the processes that wrote it; a resume of a
    single file (DDP's) on another number is refused in one line naming what cannot
    reshard (an FSDP2 folder reshards: tests/distributed/test_crash_resume.py)."""
    import torch

    root = tmp_path / "run"
    assert main(tiny_cli_args(prepared_tokens, root, steps=3) + ["--trainer.logger", "false"]) == 0
    checkpoint = root / "checkpoints" / "step-00000003.ckpt"
    state = torch.load(checkpoint, weights_only=True)
    assert state["layerdrop"]["world"] == {"processes": 1, "strategy": "SingleDeviceStrategy",
                                           "accumulate_grad_batches": 1}
    state["layerdrop"]["world"]["processes"] = 2  # as a 2-rank DDP run writes it
    elsewhere = tmp_path / "two-ranks.ckpt"
    torch.save(state, elsewhere)
    capsys.readouterr()
    assert main(tiny_cli_args(prepared_tokens, tmp_path / "resumed", steps=6) + [
        "--trainer.logger", "false", "--resume", str(elsewhere)]) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith("error: the checkpoint was written by 2 processes (SingleDeviceStrategy) and this run has 1")
    assert "only an FSDP2/HSDP checkpoint (a DCP folder) resumed under fsdp, hsdp or single is resharded" in line
    assert "resume on 2 processes" in line and "--model.init_from" in line


@pytest.mark.multiprocess
def test_a_resume_refused_on_three_processes_is_one_line_for_the_job(prepared_tokens, tmp_path):
    """Issue 46: every rank printed the refusal (3 identical lines from 3 processes); rank 0 alone does."""
    import torch

    root = tmp_path / "run"
    assert main(tiny_cli_args(prepared_tokens, root, steps=3) + ["--trainer.logger", "false"]) == 0
    checkpoint = root / "checkpoints" / "step-00000003.ckpt"
    state = torch.load(checkpoint, weights_only=True)
    state["layerdrop"]["world"].update(processes=2, strategy="DDPStrategy")  # as a 2-rank DDP run writes it
    torch.save(state, tmp_path / "two-ranks.ckpt")
    done = layerdrop("pretrain", *tiny_cli_args(prepared_tokens, tmp_path / "resumed", steps=6),
                     "--trainer.logger", "false", "--trainer.devices", "3", "--trainer.strategy", "ddp",
                     "--resume", str(tmp_path / "two-ranks.ckpt"))
    assert refusal(done).startswith("error: the checkpoint was written by 2 processes (DDPStrategy) and this run "
                                    "has 3 (DDPStrategy)")


def test_a_folder_of_shards_under_a_strategy_that_cannot_read_it_is_one_line():
    """A folder of shards under a strategy whose loader opens a file (a DCP folder under
    ddp, a DeepSpeed folder under ddp) was an IsADirectoryError traceback from
    Lightning's file loader. A DCP folder under `single` is read whole (2 -> 1:
    tests/distributed/test_crash_resume.py)."""
    from types import SimpleNamespace

    from framework.checkpoint.resume import check_form_fits

    def checkpoint(form):
        return SimpleNamespace(form=SimpleNamespace(name=form), path="runs/x/checkpoints/step-00000200.ckpt")

    with pytest.raises(ValueError) as refused:
        check_form_fits(checkpoint("dcp"), "ddp")
    assert str(refused.value) == (
        "checkpoint 'runs/x/checkpoints/step-00000200.ckpt' is an FSDP2/HSDP folder (DCP), which "
        "trainer.strategy='ddp' cannot resume: resume it under fsdp or hsdp (on any number of processes) or single, "
        "or start a new run from its weights (--model.init_from CHECKPOINT)")
    with pytest.raises(ValueError, match="a DeepSpeed folder, which trainer.strategy='ddp' cannot resume"):
        check_form_fits(checkpoint("deepspeed"), "ddp")
    fsdp2 = {"class_path": "framework.strategies.FSDP2Strategy"}
    for form, strategy in (("dcp", "fsdp"), ("dcp", "hsdp"), ("dcp", fsdp2), ("dcp", "single"),
                           ("deepspeed", SimpleNamespace(class_path="cpu_deepspeed.CPUDeepSpeedStrategy")),
                           ("lightning", "single"), ("lightning", "fsdp")):
        check_form_fits(checkpoint(form), strategy)
    check_form_fits(None, "single")

"""`layerdrop pretrain` end to end on real prepared data, and its refusals."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
import yaml

from framework.checkpoint import load_decoder
from framework.files.manifest import data_identity, read_manifest
from framework.training.module import LayerDropModule
from framework.training.pretrain import main
from tests.helpers.tiny_training import tiny_cli_args


@pytest.fixture(scope="module")
def data_dir(prepared_tokens):
    return prepared_tokens


@pytest.fixture(scope="module")
def finished_run(data_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("run") / "tiny"
    assert main(tiny_cli_args(data_dir, root)) == 0
    return root


def test_help_and_print_config(capsys):
    assert main(["--help"]) == 0
    assert "usage: layerdrop pretrain" in capsys.readouterr().out
    assert main(["--config", "recipes/tiny.yaml", "--model.layer_dropout.p_max", "0.3", "--print_config"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["model"]["layer_dropout"]["p_max"] == 0.3
    assert {"checkpoint", "throughput", "summary", "resume"} <= set(printed)


def test_a_run_leaves_config_logs_checkpoints_and_summary(finished_run, data_dir, capsys):
    config = yaml.safe_load((finished_run / "lightning_logs" / "version_0" / "config.yaml").read_text())
    assert config["model"]["decoder"]["d_model"] == 32 and config["trainer"]["max_steps"] == 6
    events = list((finished_run / "lightning_logs" / "version_0").glob("events.out.tfevents.*"))
    assert events, "TensorBoard is the default logger"
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    scalars = EventAccumulator(str(events[0].parent))
    scalars.Reload()
    assert {"train/loss", "val/loss", "val/ppl", "layer_dropout/mean_p", "layer_dropout/effective_depth",
            "flops/executed_step", "flops/dense_step", "flops/saved_pct", "throughput/tokens_per_sec",
            "lr-AdamW/hidden"} <= set(scalars.Tags()["scalars"])

    assert sorted(p.name for p in (finished_run / "checkpoints").iterdir() if p.suffix == ".ckpt") == \
        ["last.ckpt", "step-00000003.ckpt", "step-00000006.ckpt"]
    assert os.readlink(finished_run / "checkpoints" / "last.ckpt") == "step-00000006.ckpt"  # a link, not a copy
    ckpt = torch.load(finished_run / "checkpoints" / "last.ckpt", weights_only=True)  # tensors and plain data only
    assert ckpt["global_step"] == 6 and ckpt["layerdrop"]["model_config"]["d_model"] == 32
    assert "TokenDataModule" in ckpt  # the loader position
    decoder, cfg = load_decoder(finished_run / "checkpoints" / "last.ckpt")
    assert cfg.n_layers == 3 and cfg.logit_multiplier == 1.0
    tokens = torch.randint(0, 300, (1, 8))
    assert torch.isfinite(decoder(tokens)).all()

    summary = json.loads((finished_run / "summary.json").read_text())
    assert summary["steps"] == 6 and summary["tokens"] == 6 * 4 * 32
    assert summary["ln_vocab"] == pytest.approx(math.log(300))
    assert summary["val_loss"] < summary["ln_vocab"]
    assert summary["checkpoint"].endswith("last.ckpt")
    # the data it read, as a sweep adopting the run later checks it (eval/experiments/sweep/adoption.py)
    assert summary["data"]["identity"] == {"data": data_identity(read_manifest(str(data_dir)))}
    assert summary["data"]["identity"]["data"]["splits"]["train"]["tokens"] > 0


def error_of(capsys, argv) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err and err[-1].startswith("error: ")
    return err[-1]


def test_resume_from_a_missing_checkpoint_is_refused(data_dir, tmp_path, capsys):
    message = error_of(capsys, tiny_cli_args(data_dir, tmp_path / "run") + ["--resume", str(tmp_path / "nope.ckpt")])
    assert "--resume" in message and "no such checkpoint" in message
    assert not (tmp_path / "run").exists()


def test_resume_into_another_shape_is_refused(finished_run, data_dir, capsys):
    argv = tiny_cli_args(data_dir, finished_run, steps=8) + ["--model.decoder.n_layers", "4", "--resume", "auto"]
    message = error_of(capsys, argv)
    assert "cannot resume" in message and "n_layers: checkpoint 3, config 4" in message


def test_data_with_a_larger_vocabulary_is_refused(data_dir, tmp_path, capsys):
    message = error_of(capsys, tiny_cli_args(data_dir, tmp_path) + ["--model.decoder.vocab_size", "200"])
    assert "vocab_size 300" in message and "200" in message


def test_a_fresh_run_does_not_overwrite_an_earlier_one(finished_run, data_dir, capsys):
    before = (finished_run / "checkpoints" / "last.ckpt").read_bytes()
    message = error_of(capsys, tiny_cli_args(data_dir, finished_run))
    assert "already holds" in message and "--resume auto" in message
    assert (finished_run / "checkpoints" / "last.ckpt").read_bytes() == before


def test_resuming_a_finished_run_changes_no_file_and_shows_its_summary(finished_run, data_dir, capsys):
    """`--resume auto` on a run that has finished (its last step saved, exported and
    summarised) has nothing to do: it says so in one line, shows the summary the run
    wrote, exits 0 and leaves every file as it was. It once rewrote summary.json with
    val_loss null, throughput null and checkpoint "", and logged into the run again."""
    from tests.helpers.refusals import hashes

    before = hashes(finished_run)
    summary = json.loads((finished_run / "summary.json").read_text())
    assert main(tiny_cli_args(data_dir, finished_run) + ["--resume", "auto"]) == 0
    out = capsys.readouterr().out
    assert f"resume: {finished_run} finished at step 6 (trainer.max_steps 6): nothing to train; " \
           "its files are left as they were" in out, out
    assert f"val loss         {summary['val_loss']:.4f}" in out and "checkpoint       " + summary["checkpoint"] in out
    assert hashes(finished_run) == before and os.readlink(finished_run / "checkpoints" / "last.ckpt") == \
        "step-00000006.ckpt"


def test_a_run_folder_in_use_by_another_process_is_refused_naming_it(finished_run, data_dir, capsys):
    """Two runs, one folder: the second is one line naming the first (pid, host, start)
    and changes nothing; a lock left by a process that died is taken over (the crash
    tests: tests/distributed/test_crash_resume.py)."""
    import socket
    import subprocess
    import sys

    from framework.files.run_lock import LOCK_FILE
    from tests.helpers.refusals import hashes

    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        (finished_run / LOCK_FILE).write_text(json.dumps({
            "pid": holder.pid, "host": socket.gethostname(), "started": "2026-12-02 10:00:00 UTC",
            "command": "pretrain", "heartbeat": 0, "token": "0123"}))
        before = hashes(finished_run)
        message = error_of(capsys, tiny_cli_args(data_dir, finished_run) + ["--resume", "auto"])
        assert f"is in use: `layerdrop pretrain` (pid {holder.pid} on {socket.gethostname()}" in message
        assert "2026-12-02 10:00:00 UTC" in message
        assert hashes(finished_run) == before
    finally:
        holder.kill()
        holder.wait()
        (finished_run / LOCK_FILE).unlink()


def test_decreasing_schedule_without_max_steps_is_refused(data_dir, tmp_path, capsys):
    argv = tiny_cli_args(data_dir, tmp_path) + ["--trainer.max_steps", "-1", "--trainer.max_epochs", "1"]
    assert "needs the run length" in error_of(capsys, argv)


@pytest.mark.parametrize("flag,value,expected", [
    ("--trainer.max_steps", "-5", "trainer.max_steps=-5 is invalid: pretraining needs the run length"),
    ("--trainer.devices", "0", "trainer.devices=0 is invalid: a positive number of devices, -1"),
    ("--trainer.accumulate_grad_batches", "0", "trainer.accumulate_grad_batches=0 is invalid: must be > 0"),
    ("--guard.max_consecutive_nonfinite", "0", "guard.max_consecutive_nonfinite=0 is invalid"),
    ("--model.no_such_key", "3", "unrecognized arguments: --model.no_such_key 3; see layerdrop pretrain --help"),
    ("--trainer.max_steps", "many", 'Parser key "trainer.max_steps": Expected a <class \'int\'>. Got value: many; '
                                    "see layerdrop pretrain --help"),
])
def test_bad_settings_are_one_line_before_the_model_is_built(data_dir, tmp_path, capsys, monkeypatch, flag, value,
                                                             expected):
    monkeypatch.setattr(LayerDropModule, "configure_model", lambda self: pytest.fail("the model was built"))
    assert main(tiny_cli_args(data_dir, tmp_path / "run") + [flag, value]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith("error: ") and expected in err[0], err
    assert not (tmp_path / "run" / "lightning_logs").exists()


def test_an_unknown_key_in_a_recipe_is_one_line(data_dir, tmp_path, capsys):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({"model": {"decoder": {"d_model": 32}, "dropout_everything": True}}))
    assert main(tiny_cli_args(data_dir, tmp_path / "run") + ["--config", str(recipe)]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert err == ["error: Group 'model' does not accept option 'dropout_everything'; see layerdrop pretrain --help"]


class FailBeforeTheFirstStep(pl.Callback):
    def on_train_start(self, trainer, pl_module):
        raise ValueError("the run failed before its first step")


def test_a_run_that_fails_before_its_first_step_leaves_no_log_folder(data_dir, tmp_path, capsys):
    callbacks = json.dumps([{"class_path": "test_pretrain.FailBeforeTheFirstStep"}])
    argv = tiny_cli_args(data_dir, tmp_path / "run") + ["--trainer.callbacks", callbacks]
    assert error_of(capsys, argv) == "error: the run failed before its first step"
    assert not (tmp_path / "run" / "lightning_logs").exists()


def test_sequences_longer_than_the_model_allows_are_refused(data_dir, tmp_path, capsys):
    message = error_of(capsys, tiny_cli_args(data_dir, tmp_path) + ["--data.seq_len", "64"])
    assert "data.seq_len=64 is invalid" in message


def test_bad_model_config_is_one_line(data_dir, tmp_path, capsys):
    message = error_of(capsys, tiny_cli_args(data_dir, tmp_path) + ["--model.decoder.n_heads", "5"])
    assert "n_heads=5 is invalid" in message


def test_a_run_logging_to_a_file_prints_progress_lines(data_dir, tmp_path, capsys):
    """stdout is not a terminal here (captured), as in SLURM, nohup or a sweep's log."""
    from framework.console.progress_line import parse_progress_line

    assert main([*tiny_cli_args(data_dir, tmp_path / "run", steps=4), "--progress_every", "0"]) == 0
    lines = [line for line in map(parse_progress_line, capsys.readouterr().out.splitlines()) if line]
    assert [(line.step, line.total) for line in lines] == [(1, 4), (2, 4), (3, 4), (4, 4)]
    assert main([*tiny_cli_args(data_dir, tmp_path / "quiet", steps=2), "--progress_every", "null"]) == 0
    assert not [line for line in capsys.readouterr().out.splitlines() if parse_progress_line(line)]


def test_a_negative_progress_interval_is_refused_before_the_run(data_dir, tmp_path, capsys):
    assert main([*tiny_cli_args(data_dir, tmp_path / "run"), "--progress_every", "-5"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "error: progress_every=-5.0 is invalid: must be a number of seconds >= 0, or null for no progress lines"]
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_ctrl_c_exits_130_with_the_resume_command_and_the_resumed_run_logs_on_in_its_version(data_dir, tmp_path):
    """Ctrl-C used to exit 1 with no hint, and the resumed run logged to a new version_1."""
    repo = Path(__file__).resolve().parents[2]
    root = tmp_path / "run"
    args = [*tiny_cli_args(data_dir, root, steps=30), "--progress_every", "0", "--checkpoint.every_n_steps", "2"]
    child = subprocess.Popen([sys.executable, "-m", "framework.cli", "pretrain", *args], cwd=repo, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    for line in child.stdout:
        if line.startswith("step ") and int(line.split()[1].split("/")[0]) >= 4:
            break
    child.send_signal(signal.SIGINT)
    _, err = child.communicate(timeout=300)
    assert child.returncode == 130, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: stopped by Ctrl-C at step ") and last.endswith("--resume auto"), last
    assert main([*args, "--resume", "auto"]) == 0
    assert sorted(p.name for p in (root / "lightning_logs").iterdir()) == ["version_0"]


def test_tensorboard_holds_no_placeholder_hp_metric(finished_run):
    """Lightning's default logger wrote `hp_metric = -1` into every run."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    scalars = EventAccumulator(str(finished_run / "lightning_logs" / "version_0"))
    scalars.Reload()
    assert "train/loss" in scalars.Tags()["scalars"] and "hp_metric" not in scalars.Tags()["scalars"]


def test_no_progress_bar_frames_in_a_log(data_dir, tmp_path, capfd):
    """Lightning's bar drew its last frame (`v_num: 0.000`) into a log after the summary."""
    args = [*tiny_cli_args(data_dir, tmp_path / "run", steps=2), "--trainer.enable_progress_bar", "null"]
    assert main(args) == 0
    out, err = capfd.readouterr()
    assert "step 2/2" in out  # the progress lines
    assert "v_num" not in out + err and "\r" not in out + err


def test_a_recipe_naming_a_file_whose_aliases_expand_too_far_is_one_line(tmp_path):
    """jsonargparse reads a file a recipe value names (``decoder: other.yaml``) with its own
    YAML loader, which issue 46 saw build a "billion laughs" to 4 GB; the loader is bounded.
    Run as a user runs it, with its memory capped so that an expansion fails rather than swaps."""
    from tests.helpers.hostile_files import billion_laughs

    (tmp_path / "decoder.yaml").write_text(billion_laughs())
    (tmp_path / "recipe.yaml").write_text(f"model:\n  decoder: {tmp_path / 'decoder.yaml'}\n")
    probe = ("import resource, sys; resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30)); "
             "from framework.cli import main; sys.exit(main(sys.argv[1:]))")
    result = subprocess.run([sys.executable, "-c", probe, "pretrain", "--config", "recipes/tiny.yaml",
                             "--config", str(tmp_path / "recipe.yaml")], capture_output=True, text=True,
                            timeout=600, cwd=Path(__file__).parents[2],
                            env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])})
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.splitlines() == ["error: a YAML document the recipe parser read is refused: its YAML aliases "
                                          "repeat more than 100,000 values; write the repeated values out"]

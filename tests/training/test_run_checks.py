"""A recipe checked as a whole before the model is built (framework/training/run_checks.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from framework.training.pretrain import main
from framework.training.run_checks import (check_run, check_warmup, clamp_validation, prefer_command_line,
                                           split_print_config)
from tests.helpers.tiny_training import tiny_cli_args

REPO = Path(__file__).resolve().parents[2]


def test_a_warmup_as_long_as_the_run_is_refused_naming_both_flags():
    with pytest.raises(ValueError, match=r"^model.lr_schedule.warmup_steps=200 is invalid: the warmup must be "
                                         r"shorter than trainer.max_steps=200; set --model.lr_schedule.warmup_steps"):
        check_warmup({"warmup_steps": 200}, 200)
    check_warmup({"warmup_fraction": 0.02}, 200)  # 4 steps
    check_warmup({"warmup_fraction": 0.02}, 2)  # at least 1 step, still shorter than the run


def test_a_validation_interval_longer_than_the_run_validates_at_its_end(capsys):
    trainer = SimpleNamespace(val_check_interval=1000)
    clamp_validation(trainer, 200)
    assert trainer.val_check_interval == 200
    assert "trainer.val_check_interval=1000 is longer than the run" in capsys.readouterr().err
    fraction = SimpleNamespace(val_check_interval=0.5)
    clamp_validation(fraction, 200)
    assert fraction.val_check_interval == 0.5


def test_a_command_line_warmup_replaces_the_recipes_other_form():
    schedule = SimpleNamespace(warmup_steps=0, warmup_fraction=0.02)
    prefer_command_line(schedule, ["--config", "r.yaml", "--model.lr_schedule.warmup_steps", "5"])
    assert (schedule.warmup_steps, schedule.warmup_fraction) == (0, 0.0)
    schedule = SimpleNamespace(warmup_steps=20, warmup_fraction=0.0)
    prefer_command_line(schedule, ["--model.lr_schedule.warmup_fraction=0.1"])
    assert schedule.warmup_steps == 0


def test_print_config_is_taken_out_of_the_arguments():
    assert split_print_config(["--config", "x", "--print_config"]) == \
        (["--config", "x"], {"skip_unset": False, "skip_validation": False})
    assert split_print_config(["--print_config=skip_default"])[1]["skip_default"] is True
    assert split_print_config(["--config", "x"]) == (["--config", "x"], None)
    with pytest.raises(ValueError, match="--print_config=bogus is invalid"):
        split_print_config(["--print_config=bogus"])


def _config(data_dir, **trainer):
    settings = {"max_steps": 10, "val_check_interval": 5, "check_val_every_n_epoch": 1, "devices": 1,
                "num_nodes": 1, "limit_train_batches": None, **trainer}
    return SimpleNamespace(trainer=SimpleNamespace(**settings),
                           model=SimpleNamespace(lr_schedule={"warmup_steps": 1}),
                           data={"data_dir": str(data_dir), "seq_len": 32, "batch_size": 4, "val_batches": 2,
                                 "model_vocab_size": 300})


def test_a_validation_interval_longer_than_an_epoch_is_refused_before_the_model(prepared_tokens):
    check_run(_config(prepared_tokens))
    with pytest.raises(ValueError, match=r"trainer.val_check_interval=\d+ is invalid: one pass over the train split "
                                         r"of .* is \d+ batches \(of 4 x 2 sequences\); set "
                                         r"--trainer.val_check_interval <= \d+"):
        check_run(_config(prepared_tokens, max_steps=10**6, val_check_interval=10**5, devices=2))


def test_a_sequence_longer_than_the_val_split_is_refused(prepared_tokens):
    config = _config(prepared_tokens)
    config.data["seq_len"] = 10**6
    with pytest.raises(ValueError, match="seq_len"):
        check_run(config)


def test_print_config_runs_the_checks(capsys):
    """On the old main --print_config exited 0 for a recipe whose run then failed."""
    recipe = str(REPO / "recipes" / "tiny.yaml")
    assert main(["--config", recipe, "--trainer.max_steps", "10", "--model.lr_schedule.warmup_steps", "10",
                 "--print_config"]) == 2
    assert "warmup must be shorter than trainer.max_steps=10" in capsys.readouterr().err
    assert main(["--config", str(REPO / "recipes" / "llama-continued.yaml"), "--trainer.max_steps", "200",
                 "--print_config"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["trainer"]["val_check_interval"] == 200  # validated once, at the end


def test_a_run_refused_late_leaves_no_folder(prepared_tokens, tmp_path):
    """The README's Llama path stopped on warmup vs steps inside fit, leaving the run
    folder and checkpoints/tokenizer.json; now it stops before anything is made."""
    root = tmp_path / "runs" / "tiny"
    argv = [*tiny_cli_args(prepared_tokens, root, steps=4), "--model.lr_schedule.warmup_steps", "4"]
    done = subprocess.run([sys.executable, "-m", "framework.cli", "pretrain", *argv], cwd=REPO, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith("error: model.lr_schedule.warmup_steps=4 is invalid")
    assert not root.exists()

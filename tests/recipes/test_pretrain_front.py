"""`layerdrop pretrain`'s answers before Lightning (framework/recipes/pretrain_front.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from framework.recipes.pretrain_front import _Unreadable, check_values, read_command_line

REPO = Path(__file__).resolve().parents[2]
TINY = str(REPO / "recipes" / "tiny.yaml")


def test_a_command_line_reads_as_a_recipe_then_its_overrides(tmp_path):
    settings = read_command_line(["--config", TINY, "--trainer.max_steps", "4", "--model.lr_schedule.warmup_steps=2",
                                  "--print_config"])
    values = settings["values"]
    assert values["trainer"]["max_steps"] == 4 and values["model"]["decoder"]["d_model"] == 256
    # the command line's warmup replaces the recipe's fraction, as in `pretrain`
    assert values["model"]["lr_schedule"]["warmup_steps"] == 2
    assert values["model"]["lr_schedule"]["warmup_fraction"] == 0.0
    assert ("trainer.max_steps", "the command line") in settings["keys"]
    assert ("model.decoder.d_model", TINY) in settings["keys"]
    check_values(values)
    with pytest.raises(_Unreadable):
        read_command_line(["-c", TINY])  # the short form is the parser's to read


def test_a_warmup_as_long_as_the_run_is_refused_from_the_command_line():
    values = read_command_line(["--config", TINY, "--trainer.max_steps", "5"])["values"]
    with pytest.raises(ValueError, match="warmup"):
        check_values({**values, "model": {"lr_schedule": {"warmup_steps": 5}}})
    with pytest.raises(ValueError, match=r"trainer.max_steps=-5 is invalid"):
        check_values({"trainer": {"max_steps": -5}})


def test_a_run_of_10_to_the_12_steps_is_a_run_length_written_in_digits():
    """Issue 46, decided: 10^12 steps is accepted (nothing is sized by max_steps; the ETA
    of the first progress line says what it means); written 1e12 (text to YAML, a float to
    jsonargparse) it is refused saying how to write it, not "pretraining needs the run length"."""
    check_values({"trainer": {"max_steps": 10**12}})
    values = read_command_line(["--config", TINY, "--trainer.max_steps", "1e12"])["values"]
    with pytest.raises(ValueError) as refusal:
        check_values(values)
    assert str(refusal.value) == ("trainer.max_steps='1e12' is invalid: a whole number of optimizer steps, written in "
                                  "digits (1000000000000)")
    with pytest.raises(ValueError, match=r"^trainer.max_steps=2.5 is invalid: pretraining needs the run length"):
        check_values({"trainer": {"max_steps": 2.5}})


PROBE = """
import json, sys
from framework.cli import main
codes = [main(argv) for argv in ({runs})]
print(json.dumps({{"codes": codes, "lightning": sorted(m for m in sys.modules if m.split(".")[0] == "lightning")}}))
"""


@pytest.mark.slow
def test_help_a_typo_and_a_warmup_error_answer_without_importing_lightning(tmp_path):
    """On the old main each of these imported Lightning and the model stack first (~5 s)."""
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache"), "PYTHONPATH": str(REPO)}
    runs = [["pretrain", "--help"], ["pretrain", "--config", TINY, "--trainer.max_stepz", "5"],
            ["pretrain", "--config", TINY, "--trainer.max_steps", "10", "--model.lr_schedule.warmup_steps", "10"]]
    warm = subprocess.run([sys.executable, "-c", PROBE.format(runs=repr(runs[:2]))], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert warm.returncode == 0, warm.stderr  # the first answers build the parser once
    done = subprocess.run([sys.executable, "-c", PROBE.format(runs=repr(runs))], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == {"codes": [0, 2, 2], "lightning": []}
    assert "usage: layerdrop pretrain" in done.stdout
    errors = done.stderr.strip().splitlines()
    assert errors[0] == "error: 'trainer.max_stepz' is not a recipe key (did you mean 'trainer.max_steps'?); " \
                        "see layerdrop pretrain --help"
    assert errors[1].startswith("error: model.lr_schedule.warmup_steps=10 is invalid")


def test_the_layer_dropout_keys_are_described_in_help(tmp_path, monkeypatch):
    """They were listed with a type and a default only."""
    from framework.recipes.pretrain_front import help_text

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    text = help_text()
    for key in ("p_max", "distribution", "schedule", "structure", "mask", "r_train", "seed"):
        entry = text[text.index(f"\n  --model.layer_dropout.{key} "):].split("\n", 2)[2]
        assert not entry.lstrip().startswith("(type:"), f"--model.layer_dropout.{key} has no description"


def test_every_committed_recipe_and_a_printed_config_pass_the_front(tmp_path, capsys):
    """The front refuses nothing the parser accepts: each recipe, and `--print_config`'s
    output read back as a recipe (what `layerdrop sweep` runs)."""
    from framework.recipes.pretrain_front import refuse_unknown_keys
    from framework.training.pretrain import main as pretrain_main

    assert pretrain_main(["--config", TINY, "--print_config"]) == 0
    printed = tmp_path / "config.yaml"
    printed.write_text(capsys.readouterr().out)
    for recipe in [printed, *sorted((REPO / "recipes").glob("*.yaml"))]:
        settings = read_command_line(["--config", str(recipe)])
        refuse_unknown_keys(settings)
        check_values(settings["values"])


def test_a_recipe_whose_aliases_expand_too_far_is_one_line_naming_it(tmp_path, capsys):
    """Issue 46: a 600-byte "billion laughs" under model.layer_dropout.distribution grew
    `pretrain` to 4 GB with no output (the front read it, then left it to jsonargparse)."""
    from framework.recipes.pretrain_front import quick_answer
    from tests.helpers.hostile_files import billion_laughs

    bomb = tmp_path / "laughs.yaml"
    bomb.write_text("model:\n  layer_dropout:\n    distribution:\n" +
                    "".join(f"      {line}\n" for line in billion_laughs().splitlines()))
    inline = "{" + billion_laughs().replace("\n", ", ") + "}"
    named = f"error: --config {str(bomb)!r} is refused: its YAML aliases repeat more than 100,000 values"
    for argv, start in ((["--config", TINY, "--config", str(bomb)], named), ([f"--config={bomb}"], named),
                        (["stray", "--config", str(bomb)], named),  # a command line the front leaves to the parser
                        (["--config", TINY, "--model.layer_dropout.distribution", inline],
                         "error: --model.layer_dropout.distribution '{a0: &a0 [lol,")):
        assert quick_answer(argv) == 2
        err = capsys.readouterr().err.splitlines()
        assert len(err) == 1 and err[0].startswith(start) and err[0].endswith("see layerdrop pretrain --help"), err

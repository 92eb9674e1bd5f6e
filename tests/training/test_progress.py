"""A pretraining run's progress: the bar counted in optimizer steps, the lines in a log."""

from __future__ import annotations

import pytest

from framework.console.progress_line import parse_progress_line
from framework.training.progress import StepProgressBar, StepProgressLines
from tests.helpers.tiny_training import RandomTokens, quiet_trainer, tiny_module


def test_the_training_bar_counts_optimizer_steps_out_of_max_steps():
    bar = StepProgressBar()
    trainer = quiet_trainer(max_steps=3, enable_progress_bar=True, callbacks=[bar], accumulate_grad_batches=2)
    trainer.fit(tiny_module(), datamodule=RandomTokens(batches=16))
    task = bar.progress.tasks[bar.train_progress_bar_id]
    assert (task.total, task.completed) == (3, 3)  # Lightning's own: "Epoch 0/-2", 16 micro-batches
    assert "Step 3/3" in task.description


def test_a_log_gets_a_parsable_line_per_step_with_tokens_and_eta(capsys):
    trainer = quiet_trainer(max_steps=4, callbacks=[StepProgressLines(every=0)], accumulate_grad_batches=2)
    trainer.fit(tiny_module(), datamodule=RandomTokens(batch_size=8, batches=16))
    lines = [parse_progress_line(text) for text in capsys.readouterr().out.splitlines()]
    assert [(line.step, line.total) for line in lines] == [(1, 4), (2, 4), (3, 4), (4, 4)]  # steps, not batches
    assert all(line.loss > 0 and line.tokens_per_sec > 0 for line in lines)
    assert lines[-1].eta_seconds == 0


def test_lines_are_spaced_in_time_and_the_last_step_always_has_one(capsys):
    trainer = quiet_trainer(max_steps=5, callbacks=[StepProgressLines(every=3600)])
    trainer.fit(tiny_module(), datamodule=RandomTokens(batches=16))
    steps = [parse_progress_line(text).step for text in capsys.readouterr().out.splitlines()]
    assert steps == [1, 5]  # the first (the run is alive), then none for an hour, then the end


def test_a_negative_interval_is_refused():
    with pytest.raises(ValueError, match=r"progress_every=-1 is invalid: must be a number of seconds >= 0"):
        StepProgressLines(every=-1)

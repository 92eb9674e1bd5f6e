"""Progress displays: periodic lines in logs, and the training bar counted in steps."""

from __future__ import annotations

import io

from framework.progress import progress
from framework.progress_bar import StepProgressBar
from tiny_training import RandomTokens, quiet_trainer, tiny_module


def test_a_log_gets_periodic_lines_with_the_total():
    log = io.StringIO()
    with progress(3, "eval exits: batches", every=0.0, stream=log) as bar:
        for _ in range(3):
            bar.advance()
    lines = log.getvalue().splitlines()
    assert [line.split(" in ")[0] for line in lines] == ["eval exits: batches: 1/3 (33%)",
                                                         "eval exits: batches: 2/3 (67%)",
                                                         "eval exits: batches: 3/3 (100%)"]  # not twice at the end


def test_a_short_run_or_a_disabled_display_stays_silent():
    log = io.StringIO()
    with progress(2, "quick", stream=log) as bar:
        bar.advance(2)
    with progress(2, "off", enabled=False, every=0.0, stream=log) as bar:
        bar.advance(2)
    assert log.getvalue() == ""


def test_the_training_bar_counts_optimizer_steps_out_of_max_steps():
    bar = StepProgressBar()
    trainer = quiet_trainer(max_steps=3, enable_progress_bar=True, callbacks=[bar], accumulate_grad_batches=2)
    trainer.fit(tiny_module(), datamodule=RandomTokens(batches=16))
    task = bar.progress.tasks[bar.train_progress_bar_id]
    assert (task.total, task.completed) == (3, 3)  # Lightning's own: "Epoch 0/-2", 16 micro-batches
    assert "Step 3/3" in task.description

"""A run that stopped before its first step leaves no folder (framework/training/leftovers.py)."""

from __future__ import annotations

from framework.training.leftovers import holds_nothing_of_a_run, remove_if_unused


def test_only_a_run_that_made_nothing_is_removed(tmp_path):
    empty = tmp_path / "empty"
    (empty / "checkpoints").mkdir(parents=True)
    (empty / "checkpoints" / "tokenizer.json").write_text("{}")
    (empty / "lightning_logs").mkdir()
    (empty / ".layerdrop.lock.guard").write_text("")
    (empty / "checkpoints" / ".step-00000002.ckpt.staging").mkdir()
    assert holds_nothing_of_a_run(empty)

    logged = tmp_path / "logged"
    (logged / "lightning_logs" / "version_0").mkdir(parents=True)
    (logged / "lightning_logs" / "version_0" / "events.out.tfevents.1").write_text("")
    checkpointed = tmp_path / "checkpointed"
    (checkpointed / "checkpoints").mkdir(parents=True)
    (checkpointed / "checkpoints" / "step-00000002.ckpt").write_text("")
    assert not holds_nothing_of_a_run(logged) and not holds_nothing_of_a_run(checkpointed)

    remove_if_unused(empty, logged, checkpointed, tmp_path / "never-made")
    assert not empty.exists() and logged.exists() and checkpointed.exists()

"""The export at the end of a run, and a run stopped while it was being written."""

from __future__ import annotations

import json
import os

import pytest

from tests.helpers.tiny_training import tiny_cli_args


def test_a_run_stopped_during_its_final_export_ends_with_the_summary_it_would_have_had(prepared_tokens, tmp_path,
                                                                                      monkeypatch):
    """The final checkpoint is saved, the export fails half-way (as a kill -9 there leaves
    it: tests/distributed/test_crash_resume.py), `--resume auto` has nothing to train and
    makes the export. Its summary is the uninterrupted run's: the last validation loss
    (logged before the export, kept in the final checkpoint), the throughput of the
    steps that ran, the checkpoint. It once said val_loss null, throughput null and
    checkpoint ""."""
    from framework.checkpoint.safetensors_writer import SafetensorsWriter
    from framework.training.pretrain import main

    reference = tmp_path / "reference"
    assert main(tiny_cli_args(prepared_tokens, reference) + ["--trainer.logger", "false"]) == 0
    want = json.loads((reference / "summary.json").read_text())

    root = tmp_path / "run"
    write = SafetensorsWriter.write

    def first_tensor_then_stop(writer, name, tensor):
        write(writer, name, tensor)
        raise MemoryError("stopped during the export")

    monkeypatch.setattr(SafetensorsWriter, "write", first_tensor_then_stop)
    with pytest.raises(MemoryError):
        main(tiny_cli_args(prepared_tokens, root) + ["--trainer.logger", "false"])
    monkeypatch.undo()
    assert not (root / "summary.json").exists() and not (root / "export").exists()

    assert main(tiny_cli_args(prepared_tokens, root) + ["--trainer.logger", "false", "--resume", "auto"]) == 0
    got = json.loads((root / "summary.json").read_text())
    assert got["val_loss"] == want["val_loss"] is not None
    assert {k: got[k] for k in ("steps", "tokens", "training_flops")} == {k: want[k] for k in
                                                                          ("steps", "tokens", "training_flops")}
    assert got["throughput"]["tokens_per_sec"] > 0 and got["checkpoint"] == str(root / "checkpoints" / "last.ckpt")
    assert os.readlink(root / "checkpoints" / "last.ckpt") == "step-00000006.ckpt"
    assert json.loads((root / "export" / "config.json").read_text())["training"]["global_step"] == 6

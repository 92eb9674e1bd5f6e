"""framework.checkpoint.tokenizer_record and keep_tokenizer: a run keeps its tokenizer beside its checkpoints
(recorded with its sha256 and the absolute data folder), and a checkpoint finds it
from any working directory, even when the data folder is gone."""

from __future__ import annotations

import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from framework.checkpoint import CKPT_KEY, Checkpoint, CheckpointError, read_metadata
from framework.training.checkpointing.keep_tokenizer import KeepTokenizer
from framework.tokenizer import TextCodec
from framework.checkpoint.tokenizer_record import sha256_of
from tests.helpers.checkpoint_run import moved_copy, pretrained_run


@pytest.fixture(scope="module")
def run(shared_dir, prepared_tokens) -> Path:
    return pretrained_run(shared_dir, prepared_tokens)


def test_every_checkpoint_records_the_tokenizer_kept_beside_it(run):
    folder = run / "run" / "checkpoints"
    kept = folder / "tokenizer.json"
    assert kept.read_bytes() == (run / "data" / "tokenizer.json").read_bytes()
    for checkpoint in sorted(folder.glob("*.ckpt")):
        entry = read_metadata(checkpoint)[CKPT_KEY]
        assert entry["tokenizer"]["sha256"] == sha256_of(kept) and entry["tokenizer"]["file"] == "tokenizer.json"
        assert entry["data_dir"] == str(run / "data")  # absolute, though the run was given "data"
        assert read_metadata(checkpoint)["datamodule_hyper_parameters"]["data_dir"] == "data"
    assert Checkpoint.open(folder / "last.ckpt").tokenizer_record()["eos_id"] is not None


def test_found_from_another_working_directory(run, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    checkpoint = run / "run" / "checkpoints" / "last.ckpt"
    assert Checkpoint.open(checkpoint).find_tokenizer() == (run / "run" / "checkpoints" / "tokenizer.json").resolve()
    codec = TextCodec.for_checkpoint(Checkpoint.open(checkpoint))
    assert codec.path == Checkpoint.open(checkpoint).find_tokenizer() and codec.eos_id == Checkpoint.open(checkpoint).tokenizer_record()["eos_id"]


def test_found_through_the_recorded_data_folder_or_refused_in_one_line(run, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    data = tmp_path / "data-moved"
    shutil.copytree(run / "data", data)
    lone = moved_copy(run / "run" / "checkpoints" / "last.ckpt", tmp_path / "elsewhere" / "last.ckpt", data)
    assert Checkpoint.open(lone).find_tokenizer() == (data / "tokenizer.json").resolve()  # nothing beside it: the data's
    (lone.parent / "tokenizer.json").write_text("{}")  # someone else's: its sha256 differs
    assert Checkpoint.open(lone).find_tokenizer() == (data / "tokenizer.json").resolve()
    shutil.rmtree(data)
    with pytest.raises(CheckpointError, match="no tokenizer found for checkpoint") as err:
        Checkpoint.open(lone).find_tokenizer()
    message = str(err.value)
    assert "\n" not in message and "(sha256 differs from the checkpoint's)" in message
    assert str(data / "tokenizer.json") in message


def test_a_resume_with_another_tokenizer_stops_before_training(tmp_path):
    """The kept tokenizer is the one the checkpoints' token ids mean."""
    data, folder = tmp_path / "data", tmp_path / "checkpoints"
    data.mkdir()
    folder.mkdir()
    (data / "tokenizer.json").write_text('{"version": "new"}')
    (folder / "tokenizer.json").write_text('{"version": "old"}')
    (folder / "step-00000002.ckpt").write_bytes(b"")
    datamodule = SimpleNamespace(data_dir=str(data), manifest={"tokenizer": {"file": "tokenizer.json", "eos_id": 0}})
    trainer = SimpleNamespace(datamodule=datamodule, checkpoint_callback=SimpleNamespace(dirpath=str(folder)),
                              is_global_zero=True)
    keeper = KeepTokenizer()
    keeper.setup(trainer, None, "fit")
    with pytest.raises(ValueError, match="differs from the data's"):
        keeper.on_fit_start(trainer, None)
    (folder / "step-00000002.ckpt").unlink()  # nothing depends on the old one: replaced
    keeper.on_fit_start(trainer, None)
    assert (folder / "tokenizer.json").read_text() == '{"version": "new"}'

"""Periodic checkpoints (keep-last-k, never over an earlier run) and atomic saves."""

from __future__ import annotations

import os

import pytest
import torch

import framework.training.checkpointing.saving as checkpointing_module
from framework.training.checkpointing.saving import AtomicCheckpointIO, PeriodicCheckpoint
from tests.helpers.battery import hashes, layerdrop, refusal
from tests.helpers.tiny_training import RandomTokens, quiet_trainer, tiny_cli_args, tiny_module


def test_periodic_checkpoints_keep_the_newest_and_the_final_step(tmp_path):
    torch.manual_seed(0)
    checkpoint = PeriodicCheckpoint(every_n_steps=3, keep_last=2)
    trainer = quiet_trainer(max_steps=10, callbacks=[checkpoint], enable_checkpointing=True,
                            default_root_dir=str(tmp_path))
    trainer.fit(tiny_module(), RandomTokens())
    folder = tmp_path / "checkpoints"
    assert sorted(p.name for p in folder.iterdir()) == ["last.ckpt", "step-00000009.ckpt", "step-00000010.ckpt"]
    assert torch.load(folder / "last.ckpt", weights_only=True)["global_step"] == 10


def test_a_new_run_refuses_a_folder_with_checkpoints(tmp_path):
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "last.ckpt").write_bytes(b"earlier run")
    trainer = quiet_trainer(max_steps=2, callbacks=[PeriodicCheckpoint()], enable_checkpointing=True,
                            default_root_dir=str(tmp_path))
    with pytest.raises(ValueError, match="already holds last.ckpt from an earlier run: resume it"):
        trainer.fit(tiny_module(), RandomTokens())
    assert (tmp_path / "checkpoints" / "last.ckpt").read_bytes() == b"earlier run"


@pytest.mark.parametrize("name,value", [("every_n_steps", 0), ("keep_last", -1)])
def test_periodic_checkpoint_arguments_are_checked(name, value):
    with pytest.raises(ValueError, match=f"checkpoint.{name}={value} is invalid"):
        PeriodicCheckpoint(**{name: value})


def test_a_crash_during_a_save_leaves_the_previous_checkpoint_whole(tmp_path, monkeypatch):
    io, path = AtomicCheckpointIO(), tmp_path / "last.ckpt"
    io.save_checkpoint({"step": 1, "w": torch.ones(1000)}, path)
    real_save = torch.save

    def crash_half_way(obj, handle, *args, **kwargs):
        real_save(obj, handle, *args, **kwargs)
        handle.seek(handle.tell() // 2)
        handle.truncate()
        raise OSError("disk full")

    monkeypatch.setattr(checkpointing_module.torch, "save", crash_half_way)
    with pytest.raises(OSError, match="disk full"):
        io.save_checkpoint({"step": 2, "w": torch.zeros(1000)}, path)
    monkeypatch.undo()
    assert torch.load(path, weights_only=True)["step"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]  # no partial file left behind
    io.save_checkpoint({"step": 3}, path)
    assert torch.load(path, weights_only=True) == {"step": 3}


def test_the_trainer_saves_through_the_atomic_io(tmp_path):
    from framework.training.checkpointing.saving import use_atomic_checkpoint_io

    trainer = quiet_trainer(max_steps=1, default_root_dir=str(tmp_path))
    use_atomic_checkpoint_io(trainer)
    assert isinstance(trainer.strategy.checkpoint_io, AtomicCheckpointIO)


def test_checkpoint_folder_is_made_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    trainer = quiet_trainer(max_steps=2, callbacks=[PeriodicCheckpoint()], enable_checkpointing=True,
                            default_root_dir="run")
    trainer.fit(tiny_module(), RandomTokens())
    assert trainer.checkpoint_callback.dirpath == os.path.realpath(tmp_path / "run" / "checkpoints")


def test_resuming_an_older_checkpoint_sets_the_newer_ones_aside(tmp_path, capsys):
    torch.manual_seed(0)
    folder = tmp_path / "checkpoints"
    trainer = quiet_trainer(max_steps=4, enable_checkpointing=True,
                            callbacks=[PeriodicCheckpoint(every_n_steps=1, keep_last=4, dirpath=str(folder))])
    trainer.fit(tiny_module(), RandomTokens())
    first_four = (folder / "step-00000004.ckpt").read_bytes()
    trainer = quiet_trainer(max_steps=5, enable_checkpointing=True,
                            callbacks=[PeriodicCheckpoint(every_n_steps=1, keep_last=4, dirpath=str(folder))])
    trainer.fit(tiny_module(), RandomTokens(), ckpt_path=str(folder / "step-00000002.ckpt"))
    assert sorted(p.name for p in (folder / "superseded").iterdir()) == ["step-00000003.ckpt", "step-00000004.ckpt"]
    assert (folder / "superseded" / "step-00000004.ckpt").read_bytes() == first_four  # moved, not rewritten
    assert sorted(p.name for p in folder.glob("*.ckpt")) == ["last.ckpt", "step-00000002.ckpt", "step-00000003.ckpt",
                                                             "step-00000004.ckpt", "step-00000005.ckpt"]
    assert "resume: moved 2 checkpoint(s) newer than step 2" in capsys.readouterr().out


def test_a_fresh_run_keeps_off_an_earlier_runs_export_and_summary(prepared_tokens, tmp_path):
    """With its checkpoints elsewhere (--checkpoint.dirpath), a fresh run into an earlier
    run's root once replaced that run's export/ and summary.json silently."""
    root = tmp_path / "run"
    (root / "export").mkdir(parents=True)
    (root / "export" / "config.json").write_text('{"model": {}}')
    (root / "summary.json").write_text('{"steps": 2}')
    before = hashes(root)
    line = refusal(layerdrop("pretrain", *tiny_cli_args(prepared_tokens, root, steps=2),
                             "--checkpoint.dirpath", tmp_path / "elsewhere"))
    assert "already holds export and summary.json of an earlier run" in line
    assert hashes(root) == before and not (tmp_path / "elsewhere").exists()


def test_the_final_checkpoint_is_saved_before_the_export(prepared_tokens, tmp_path, monkeypatch):
    """Lightning runs checkpoint callbacks last: a failed export once lost every step
    since the last periodic save."""
    from framework.checkpoint.safetensors_writer import SafetensorsWriter
    from framework.training.pretrain import main

    def out_of_memory(self, name, tensor):  # what an OOM gathering a full tensor looks like
        raise MemoryError("gathering a full tensor")

    monkeypatch.setattr(SafetensorsWriter, "write", out_of_memory)
    with pytest.raises(MemoryError):
        main(tiny_cli_args(prepared_tokens, tmp_path / "run", steps=4) + ["--trainer.logger", "false"])
    saved = sorted(p.name for p in (tmp_path / "run" / "checkpoints").glob("step-*.ckpt"))
    assert saved == ["step-00000003.ckpt", "step-00000004.ckpt"]  # every 3 steps, and the end
    assert not (tmp_path / "run" / "export").exists()


class NoRoomAfter:
    """A file whose disk fills after ``room`` bytes (ENOSPC, as a full disk answers)."""

    def __init__(self, handle, room: int) -> None:
        self.handle, self.room, self.written = handle, room, 0

    def write(self, data) -> int:
        if self.written + len(data) > self.room:
            import errno

            raise OSError(errno.ENOSPC, "No space left on device")
        self.written += len(data)
        return self.handle.write(data)

    def flush(self) -> None:
        self.handle.flush()


def _error_lines(capsys) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if line.strip()]


def test_a_full_disk_during_a_save_is_one_line_and_the_previous_checkpoint_resumes(prepared_tokens, tmp_path,
                                                                                  monkeypatch, capsys):
    """ENOSPC half-way through the step-6 save: one line naming the file, the bytes needed
    and free, and the step-3 checkpoint (intact, still last.ckpt), then resumed from it."""
    from framework.training.pretrain import main

    real_save = torch.save

    def filling(obj, f, *args, **kwargs):
        if ".step-00000006" in str(getattr(f, "name", "")):
            f = NoRoomAfter(f, 4096)
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", filling)
    root = tmp_path / "run"
    assert main(tiny_cli_args(prepared_tokens, root)) == 1
    lines = _error_lines(capsys)
    assert "Traceback" not in "\n".join(lines) and lines[-1].startswith("error: disk full while writing "), lines
    line = lines[-1]
    assert ".step-00000006.ckpt.staging" in line and "bytes needed" in line and " free" in line, line
    assert f"the previous checkpoint {root / 'checkpoints' / 'step-00000003.ckpt'} (step 3) is intact" in line
    folder = root / "checkpoints"
    assert sorted(p.name for p in folder.iterdir() if not p.name.endswith(".json")) == [
        "last.ckpt", "step-00000003.ckpt"]
    assert os.readlink(folder / "last.ckpt") == "step-00000003.ckpt"
    monkeypatch.setattr(torch, "save", real_save)
    assert main(tiny_cli_args(prepared_tokens, root) + ["--resume", "auto"]) == 0
    assert "resume: continuing from" in capsys.readouterr().out
    assert torch.load(folder / "last.ckpt", weights_only=True)["global_step"] == 6


def test_a_save_known_not_to_fit_is_refused_before_it_starts(prepared_tokens, tmp_path, monkeypatch, capsys):
    import framework.files.disk_space as disk_space
    from framework.training.pretrain import main

    root = tmp_path / "run"
    first = root / "checkpoints" / "step-00000003.ckpt"
    monkeypatch.setattr(disk_space, "free_bytes", lambda path: 1000 if first.exists() else 10**12)
    written = []
    real_save = torch.save
    monkeypatch.setattr(torch, "save", lambda obj, f, *a, **k: (written.append(str(getattr(f, "name", f))),
                                                                real_save(obj, f, *a, **k))[1])
    assert main(tiny_cli_args(prepared_tokens, root)) == 1
    line = _error_lines(capsys)[-1]
    assert line.startswith(f"error: not enough disk space for {root / 'checkpoints' / 'step-00000006.ckpt'}: "), line
    assert f"needs {first.stat().st_size:,} bytes" in line and "1,000 are free; nothing was written" in line, line
    assert not any("00000006" in name for name in written)
    assert os.readlink(root / "checkpoints" / "last.ckpt") == "step-00000003.ckpt"


class Killed(BaseException):
    """What a kill -9 does to the code after it: nothing of it runs (no except Exception catches it)."""


def test_a_run_stopped_just_after_its_final_checkpoint_points_last_at_it_when_resumed(prepared_tokens, tmp_path,
                                                                                    monkeypatch):
    """Stopped between the final step-6 checkpoint's rename into place and last.ckpt's
    repointing: `--resume auto` continues from step 6 and exports it, and last.ckpt, which
    the README's eval commands read, points at step 6 too. It once stayed on step 3, so
    that they evaluated another model than the export."""
    from framework.training.pretrain import main

    root = tmp_path / "run"
    folder = root / "checkpoints"
    point_last = checkpointing_module.point_last

    def stop_at_the_final_link(target, link):
        if str(target).endswith("step-00000006.ckpt"):
            raise Killed
        point_last(target, link)

    monkeypatch.setattr(checkpointing_module, "point_last", stop_at_the_final_link)
    with pytest.raises(Killed):
        main(tiny_cli_args(prepared_tokens, root) + ["--trainer.logger", "false"])
    monkeypatch.undo()
    assert (folder / "step-00000006.ckpt").is_file() and os.readlink(folder / "last.ckpt") == "step-00000003.ckpt"

    assert main(tiny_cli_args(prepared_tokens, root) + ["--trainer.logger", "false", "--resume", "auto"]) == 0
    assert os.readlink(folder / "last.ckpt") == "step-00000006.ckpt"
    import json

    assert json.loads((root / "export" / "config.json").read_text())["training"]["global_step"] == 6

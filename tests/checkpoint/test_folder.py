"""The checkpoint folder's crash-safety rules: publish a complete save under its final
name (never writing into an existing checkpoint), repoint last.ckpt atomically, delete
through a hidden name, and clean what an interrupted save left behind."""

from __future__ import annotations

import os

from framework.checkpoint.folder import (clean_leftovers, point_last, publish, retire, staging_path,
                                         step_checkpoints)


def make_folder(path, files: dict[str, str]):
    path.mkdir()
    for name, text in files.items():
        (path / name).write_text(text)
    return path


def test_publish_moves_a_save_into_place_and_replaces_without_writing_into_the_old(tmp_path):
    target = tmp_path / "step-00000004.ckpt"
    old = make_folder(target, {"__0_0.distcp": "old shard", "meta.pt": "old meta"})
    old_inode = os.stat(old / "__0_0.distcp").st_ino
    staging = make_folder(staging_path(target), {"__0_0.distcp": "new shard", "meta.pt": "new meta"})
    assert staging.name == ".step-00000004.ckpt.staging"
    publish(staging, target)
    assert (target / "__0_0.distcp").read_text() == "new shard"
    assert os.stat(target / "__0_0.distcp").st_ino != old_inode  # a new folder, not rewritten files
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-00000004.ckpt"]

    single = tmp_path / "step-00000008.ckpt"
    staging_path(single).write_text("whole file")
    publish(staging_path(single), single)
    assert single.read_text() == "whole file" and not staging_path(single).exists()


def test_last_is_a_link_repointed_in_one_rename(tmp_path):
    for step in (2, 4):
        (tmp_path / f"step-0000000{step}.ckpt").write_text(str(step))
    last = tmp_path / "last.ckpt"
    point_last(tmp_path / "step-00000002.ckpt", last)
    point_last(tmp_path / "step-00000004.ckpt", last)
    assert os.readlink(last) == "step-00000004.ckpt" and last.read_text() == "4"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt", "step-00000002.ckpt", "step-00000004.ckpt"]

    earlier_layout = tmp_path / "other" / "last.ckpt"  # a real folder, as an older version wrote
    make_folder(earlier_layout.parent, {})
    make_folder(earlier_layout, {"meta.pt": "x"})
    (earlier_layout.parent / "step-00000006.ckpt").write_text("6")
    point_last(earlier_layout.parent / "step-00000006.ckpt", earlier_layout)
    assert earlier_layout.is_symlink() and earlier_layout.read_text() == "6"
    assert sorted(p.name for p in earlier_layout.parent.iterdir()) == ["last.ckpt", "step-00000006.ckpt"]


def test_retire_deletes_through_a_hidden_name(tmp_path):
    doomed = make_folder(tmp_path / "step-00000002.ckpt", {"meta.pt": "x"})
    retire(doomed)
    retire(tmp_path / "step-00000099.ckpt")  # already gone: nothing to do
    assert list(tmp_path.iterdir()) == []


def test_leftovers_of_interrupted_saves_are_cleaned(tmp_path):
    make_folder(tmp_path / ".step-00000006.ckpt.staging", {"__1_0.distcp": "half"})
    (tmp_path / "..step-00000003.ckpt.staging.partial-4242").write_text("half a file")
    make_folder(tmp_path / ".step-00000002.ckpt.deleting", {"meta.pt": "x"})
    os.symlink("step-00000004.ckpt", tmp_path / ".last.ckpt.link")
    make_folder(tmp_path / ".step-00000004.ckpt.replaced", {"meta.pt": "moved aside"})  # its replacement never came
    (tmp_path / "step-00000005.ckpt").write_text("complete")
    (tmp_path / "tokenizer.json").write_text("{}")
    removed = clean_leftovers(tmp_path)
    assert removed == ["..step-00000003.ckpt.staging.partial-4242", ".last.ckpt.link",
                       ".step-00000002.ckpt.deleting", ".step-00000006.ckpt.staging"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-00000004.ckpt", "step-00000005.ckpt",
                                                          "tokenizer.json"]
    assert (tmp_path / "step-00000004.ckpt" / "meta.pt").read_text() == "moved aside"
    assert [step for step, _ in step_checkpoints(tmp_path)] == [5, 4]

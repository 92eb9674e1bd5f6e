"""A full disk recognised wherever a library wrapped it, and a write refused before it starts."""

from __future__ import annotations

import errno

import pytest

from framework.files.disk_space import DiskFull, check_room, is_disk_full, size_on_disk


def test_enospc_is_found_inside_the_errors_libraries_wrap_it_in():
    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError:
            raise RuntimeError("PytorchStreamWriter failed writing file data/0")
    except RuntimeError as wrapped:
        assert is_disk_full(wrapped)
    assert is_disk_full(RuntimeError("[enforce fail] write failed: No space left on device"))
    assert is_disk_full(OSError(errno.EDQUOT, "Disk quota exceeded"))
    assert not is_disk_full(OSError(errno.EACCES, "Permission denied"))
    assert not is_disk_full(RuntimeError("shape mismatch"))


def test_a_write_that_cannot_fit_is_refused_in_one_line(tmp_path):
    check_room(tmp_path / "small", 1)
    with pytest.raises(DiskFull) as full:
        check_room(tmp_path / "new" / "huge.ckpt", 1 << 62, "the save")
    assert "\n" not in str(full.value) and f"{1 << 62:,} bytes" in str(full.value) and "huge.ckpt" in str(full.value)
    assert is_disk_full(full.value)


def test_size_on_disk_of_a_file_and_of_a_folder_of_shards(tmp_path):
    (tmp_path / "shards").mkdir()
    (tmp_path / "shards" / "a").write_bytes(b"x" * 10)
    (tmp_path / "shards" / "b").write_bytes(b"x" * 5)
    assert size_on_disk(tmp_path / "shards") == 15 and size_on_disk(tmp_path / "shards" / "a") == 10
    assert size_on_disk(tmp_path / "missing") == 0

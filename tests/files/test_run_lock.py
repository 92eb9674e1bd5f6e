"""The run-folder lock: one holder, named when refused; a dead or silent holder taken over;
children of the holder let in."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from framework.files import run_lock
from framework.files.run_lock import HELD_ENV, LOCK_FILE, RunFolderInUse, RunLock, in_use, read_holder


@pytest.fixture(autouse=True)
def no_inherited_locks(monkeypatch):
    monkeypatch.delenv(HELD_ENV, raising=False)


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def plant(folder, **record):
    folder.mkdir(parents=True, exist_ok=True)
    base = {"pid": os.getpid(), "host": socket.gethostname(), "started": "2026-12-01 00:00:00 UTC",
            "command": "pretrain", "heartbeat": time.time(), "token": "feedface"}
    (folder / LOCK_FILE).write_text(json.dumps({**base, **record}))


def test_the_holder_is_recorded_and_a_second_command_is_refused_naming_it(tmp_path):
    lock = RunLock(tmp_path / "run", "pretrain")
    assert lock.acquire() is None
    record = read_holder(tmp_path / "run" / LOCK_FILE)
    assert record["pid"] == os.getpid() and record["host"] == socket.gethostname()
    assert record["command"] == "pretrain" and record["started"] and record["heartbeat"] <= time.time()
    with pytest.raises(RunFolderInUse) as refused:
        RunLock(tmp_path / "run", "sweep").acquire()
    message = str(refused.value)
    assert "\n" not in message and f"pid {os.getpid()} on {socket.gethostname()}" in message
    assert "`layerdrop pretrain`" in message and "is in use" in message
    lock.release()
    assert not (tmp_path / "run" / LOCK_FILE).exists()
    with RunLock(tmp_path / "run", "sweep"):  # free again
        pass


def test_a_lock_left_by_a_dead_process_on_this_host_is_taken_over_with_a_note(tmp_path):
    pid = dead_pid()
    plant(tmp_path, pid=pid, heartbeat=time.time())  # a fresh heartbeat does not keep a dead holder
    lock = RunLock(tmp_path, "pretrain")
    note = lock.acquire()
    assert note is not None and f"process {pid} no longer runs on this host" in note
    assert read_holder(tmp_path / LOCK_FILE)["pid"] == os.getpid()
    lock.release()


def test_a_reused_pid_is_not_the_holder(tmp_path):
    plant(tmp_path, start_ticks=(run_lock.start_ticks(os.getpid()) or 0) + 1)  # our pid, another start time
    lock = RunLock(tmp_path, "pretrain")
    assert "no longer runs" in lock.acquire()
    lock.release()


def test_a_holder_on_another_host_is_judged_by_its_heartbeat(tmp_path):
    plant(tmp_path, host="node-17", pid=4242, heartbeat=time.time() - 5)
    with pytest.raises(RunFolderInUse, match="pid 4242 on node-17"):
        RunLock(tmp_path, "pretrain", stale_after=60).acquire()
    plant(tmp_path, host="node-17", pid=4242, heartbeat=time.time() - 120)
    lock = RunLock(tmp_path, "pretrain", stale_after=60)
    assert "heartbeat is 120 s old" in lock.acquire()
    lock.release()


def test_a_live_holder_on_this_host_keeps_its_lock_whatever_its_heartbeat(tmp_path):
    plant(tmp_path, heartbeat=time.time() - 10_000)
    with pytest.raises(RunFolderInUse):
        RunLock(tmp_path, "pretrain", stale_after=60).acquire()


def test_a_record_that_cannot_be_read_counts_as_a_silent_holder(tmp_path):
    (tmp_path / LOCK_FILE).write_text("{not json")
    with pytest.raises(RunFolderInUse):
        RunLock(tmp_path, "pretrain", stale_after=60).acquire()
    os.utime(tmp_path / LOCK_FILE, (time.time() - 120, time.time() - 120))
    lock = RunLock(tmp_path, "pretrain", stale_after=60)
    assert lock.acquire() is not None
    lock.release()


@pytest.mark.parametrize("content", [b"\xff\xfe\x00 not utf-8", b"[1, 2]", b"[" * 5_000 + b"]" * 5_000])
def test_a_lock_file_that_is_not_a_record_is_named_then_taken_over_when_stale(tmp_path, content):
    """Issue 46: a lock file that was not UTF-8 raised UnicodeDecodeError on every try (the
    run blocked for good, its message naming no file)."""
    (tmp_path / LOCK_FILE).write_bytes(content)
    with pytest.raises(RunFolderInUse) as refusal:
        RunLock(tmp_path, "pretrain", stale_after=60).acquire()
    assert str(refusal.value).startswith(f"{tmp_path} is in use: a lock file that is not a layerdrop lock record, "
                                         f"{tmp_path / LOCK_FILE} (modified ")
    assert "delete it if no layerdrop command runs there" in str(refusal.value)
    assert in_use(tmp_path, stale_after=60).startswith(f"{tmp_path} is in use: a lock file that is not a layerdrop")
    os.utime(tmp_path / LOCK_FILE, (time.time() - 120, time.time() - 120))
    assert in_use(tmp_path, stale_after=60) is None
    lock = RunLock(tmp_path, "pretrain", stale_after=60)
    assert "took over the lock of" in lock.acquire()
    assert read_holder(tmp_path / LOCK_FILE)["token"] == lock.token
    lock.release()


def test_a_child_of_the_holder_joins_it_and_keeps_it_alive_after_the_parent_dies(tmp_path):
    parent = RunLock(tmp_path, "sweep")
    parent.acquire()
    assert os.environ[HELD_ENV].endswith(f"={parent.token}")
    code = ("from framework.files.run_lock import RunLock, read_holder; import sys, pathlib\n"
            f"lock = RunLock({str(tmp_path)!r}, 'pretrain'); assert lock.acquire() is None and lock.inherited\n"
            f"print(len(read_holder(pathlib.Path({str(tmp_path)!r}) / {LOCK_FILE!r})['members']))\n"
            "lock.release()")
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=dict(os.environ))
    assert child.returncode == 0 and child.stdout.strip() == "1", child.stderr
    assert read_holder(tmp_path / LOCK_FILE)["members"] == []
    parent.release()
    # the parent died (its pid is gone) while a member still runs: the lock is still held
    plant(tmp_path, pid=dead_pid(), members=[{"pid": os.getpid(), "host": socket.gethostname()}])
    with pytest.raises(RunFolderInUse):
        RunLock(tmp_path, "sweep").acquire()


def test_in_use_looks_at_the_folder_and_every_folder_above_it(tmp_path):
    assert in_use(tmp_path / "run" / "export") is None
    lock = RunLock(tmp_path / "run", "pretrain")
    lock.acquire()
    assert in_use(tmp_path / "run" / "export") is None  # this process holds it
    monkey_env = os.environ.pop(HELD_ENV)
    try:
        assert "is in use: `layerdrop pretrain`" in in_use(tmp_path / "run" / "export")
    finally:
        os.environ[HELD_ENV] = monkey_env
    lock.release()


def test_a_refused_command_leaves_no_folder_it_made(tmp_path):
    lock = RunLock(tmp_path / "new", "pretrain")
    lock.acquire()
    lock.release()
    assert not (tmp_path / "new").exists()
    (tmp_path / "kept").mkdir()
    lock = RunLock(tmp_path / "kept", "pretrain")
    lock.acquire()
    lock.release()
    assert (tmp_path / "kept").is_dir()


def test_the_heartbeat_refreshes_the_record(tmp_path, monkeypatch):
    monkeypatch.setattr(run_lock, "HEARTBEAT_SECONDS", 0.05)
    lock = RunLock(tmp_path, "pretrain")
    lock.acquire()
    first = read_holder(tmp_path / LOCK_FILE)["heartbeat"]
    deadline = time.monotonic() + 30
    while read_holder(tmp_path / LOCK_FILE)["heartbeat"] == first:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    lock.release()

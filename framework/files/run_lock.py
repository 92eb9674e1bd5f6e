"""One writer per run folder: ``<folder>/.layerdrop.lock`` says who holds it.

    with RunLock(root, "pretrain"):        # held for the whole run; RunFolderInUse when taken
        ...
    problem = in_use(folder)               # a live holder of the folder or of one above it

The lock file is JSON: pid, host, the holder's start time and command, and a heartbeat
(seconds since the epoch) that a thread refreshes every ``HEARTBEAT_SECONDS``. A
second command on a folder in use is refused in one line naming the holder. A lock is
taken over, with a note, when it was left by a process that no longer runs on this
host, or (a holder on another host, whose process cannot be asked) when its heartbeat
is older than ``stale_after`` seconds (``LAYERDROP_LOCK_STALE_SECONDS``, default 600).
A holder on this host that still runs keeps its lock whatever its heartbeat says: a
process stopped in a debugger is not a dead one.
A lock file that is not a record (not UTF-8, not a JSON object: only a hand-made or
damaged file, since records are written atomically) is a holder on an unknown host
whose heartbeat is the file's modification time: refused in one line naming the file
until it is ``stale_after`` old, then taken over with a note, as any silent holder.

A command's children inherit its locks: the holder puts ``folder=token`` into
``LAYERDROP_HELD_LOCKS`` of its environment, so `layerdrop sweep` holding a run folder
runs `layerdrop pretrain` there, while a `pretrain` started by hand is refused.

A new lock is made with a hard link of a complete record to the lock name, which fails
when the name exists, on a local disk and on NFS alike: of two commands starting at once
exactly one gets it. Reading, taking over and rewriting a record (heartbeat, members,
release) happen inside a short ``filelock.FileLock`` on a guard file in this host's
temporary folder (named by the folder's path; nothing is left in the run folder), which
orders the commands of one host; two hosts taking over the same stale lock in the same
instant is the one race left. The record itself is ours: filelock's lease markers record
neither a start time nor a command, and a contender takes over a lease only after
watching it for the whole lease time, where `pretrain` must refuse (or take over a dead
holder's lock) at once.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import socket
import sys
import tempfile
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from filelock import FileLock

from framework.files.atomic_write import write_json
from framework.files.nesting import json_document

LOCK_FILE = ".layerdrop.lock"
HELD_ENV = "LAYERDROP_HELD_LOCKS"
STALE_ENV = "LAYERDROP_LOCK_STALE_SECONDS"
HEARTBEAT_SECONDS = 30.0
DEFAULT_STALE_SECONDS = 600.0


class RunFolderInUse(RuntimeError):
    """Another live process holds the folder; the message is the one line to print."""


class RunLock:
    """The lock of ``folder`` for ``command`` (a word for the holder line: "pretrain",
    "sweep", "export"). ``acquire`` returns a note when it took over a stale lock."""

    def __init__(self, folder: str | os.PathLike, command: str, *, stale_after: float | None = None) -> None:
        self.folder = Path(os.path.realpath(folder))
        self.path = self.folder / LOCK_FILE
        self.command = command
        self.stale_after = stale_after if stale_after is not None else stale_seconds()
        self.token: str | None = None
        self.inherited = False
        self.created = False
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None

    # -- holding ------------------------------------------------------------------
    def acquire(self) -> str | None:
        self.created = not self.folder.exists()
        self.folder.mkdir(parents=True, exist_ok=True)
        with self._guard():
            holder = read_holder(self.path)
            if holder is not None and holder.get("token") and holder.get("token") == inherited_token(self.folder) \
                    and holder.get("pid") != os.getpid():
                # A parent command holds it for us: joining as a member keeps the lock alive
                # while this process runs, should the parent die first.
                self.inherited, self.token = True, holder["token"]
                write_json(self.path, {**holder, "members": [*holder.get("members", []), self._me()]})
            else:
                note = None
                if holder is not None:
                    reason = stale_reason(holder, self.stale_after)
                    if reason is None:
                        raise RunFolderInUse(in_use_message(self.folder, holder))
                    note = f"took over the lock of {self.folder} from {describe(holder)}: {reason}"
                self.token = secrets.token_hex(8)
                record = {**self._me(), "started": now_text(), "command": self.command, "argv": sys.argv[1:][:20],
                          "heartbeat": time.time(), "token": self.token}
                if holder is None:
                    self._create(record)
                else:
                    write_json(self.path, record)
        _export_held(self.folder, self.token)
        self._stop = threading.Event()
        self._beat = threading.Thread(target=self._heartbeat, name=f"run-lock {self.folder.name}", daemon=True)
        self._beat.start()
        return None if self.inherited else note

    def release(self) -> None:
        if self.token is None:
            return
        self._stop.set()
        if self._beat is not None and self._beat is not threading.current_thread():
            self._beat.join()
        with self._guard():
            holder = read_holder(self.path)
            if holder is not None and holder.get("token") == self.token:
                if self.inherited:
                    me = self._me()
                    write_json(self.path, {**holder, "members": [m for m in holder.get("members", []) if m != me]})
                else:
                    self.path.unlink(missing_ok=True)
        if not self.inherited:
            _export_held(self.folder, None)
        self.token = None
        if self.created:
            try:  # a command refused before it wrote anything leaves no folder behind
                self.folder.rmdir()
            except OSError:
                pass

    def __enter__(self) -> "RunLock":
        note = self.acquire()
        if note:
            print(f"note: {note}", file=sys.stderr, flush=True)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()

    # -- inside ---------------------------------------------------------------------
    def _guard(self) -> FileLock:
        digest = hashlib.sha256(str(self.path).encode()).hexdigest()[:24]
        folder = Path(tempfile.gettempdir()) / f"layerdrop-locks-{os.getuid()}"
        folder.mkdir(exist_ok=True)
        return FileLock(str(folder / f"{digest}.guard"))

    def _create(self, record: dict[str, Any]) -> None:
        """The record under the lock name, or RunFolderInUse when another command made
        one first (possibly on another host)."""
        partial = self.folder / f"{LOCK_FILE}.{self.token}"
        write_json(partial, record)
        try:
            os.link(partial, self.path)
        except FileExistsError:
            raise RunFolderInUse(in_use_message(self.folder, read_holder(self.path) or {})) from None
        finally:
            partial.unlink(missing_ok=True)

    @staticmethod
    def _me() -> dict[str, Any]:
        return {"pid": os.getpid(), "host": socket.gethostname(), "start_ticks": start_ticks(os.getpid())}

    def _heartbeat(self) -> None:
        while not self._stop.wait(HEARTBEAT_SECONDS):
            try:
                with self._guard():
                    holder = read_holder(self.path)
                    if holder is None or holder.get("token") != self.token:
                        print(f"warning: the lock of {self.folder} was taken over by "
                              f"{describe(holder) if holder else 'nobody (it was removed)'}", file=sys.stderr,
                              flush=True)
                        return
                    write_json(self.path, {**holder, "heartbeat": time.time()})
            except OSError:  # a full disk or a lost mount: the next beat tries again
                continue


# ---------------------------------------------------------------- reading a record
def read_holder(path: Path) -> dict[str, Any] | None:
    """The record in ``path``; None when there is none. A record that cannot be read
    (not UTF-8, not JSON, not an object, nested too deep: a holder killed while writing
    it cannot leave one, the write is atomic, so a hand-made or damaged file) counts as a
    holder of unknown age on an unknown host, its heartbeat the file's modification time:
    refused while younger than the stale limit, naming the file, and taken over after."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError:
        data = b""
    try:
        record = json_document(data.decode("utf-8"), str(path))
    except ValueError:  # UnicodeDecodeError, JSONDecodeError and NestingError alike
        record = None
    if not isinstance(record, dict):
        return {"pid": None, "host": None, "heartbeat": _mtime(path), "command": "unknown", "unreadable": str(path)}
    return record


def stale_reason(holder: dict[str, Any], stale_after: float) -> str | None:
    """Why ``holder`` no longer holds its lock (None: it does). The holder and the
    members that joined it (its children) on this host are asked directly; one on
    another host is judged by the heartbeat, which every one of them refreshes."""
    here = socket.gethostname()
    processes = [holder, *[m for m in holder.get("members", []) if isinstance(m, dict)]]
    local = [p for p in processes if p.get("host") == here and isinstance(p.get("pid"), int)]
    if any(process_runs(p["pid"], p.get("start_ticks")) for p in local):
        return None
    if local and len(local) == len(processes):
        return f"process {holder['pid']} no longer runs on this host"
    beat = holder.get("heartbeat")
    age = time.time() - beat if isinstance(beat, (int, float)) else float("inf")
    if age > stale_after:
        return f"its heartbeat is {age:.0f} s old (limit {stale_after:.0f} s, {STALE_ENV})"
    return None


def describe(holder: dict[str, Any]) -> str:
    beat = holder.get("heartbeat")
    if holder.get("unreadable"):
        age = f"modified {time.time() - beat:.0f} s ago" if isinstance(beat, (int, float)) else "of unknown age"
        return f"a lock file that is not a layerdrop lock record, {holder['unreadable']} ({age})"
    age = f", heartbeat {time.time() - beat:.0f} s ago" if isinstance(beat, (int, float)) else ""
    return (f"`layerdrop {holder.get('command')}` (pid {holder.get('pid')} on {holder.get('host')}, started "
            f"{holder.get('started', 'at an unknown time')}{age})")


def in_use_message(folder: Path, holder: dict[str, Any]) -> str:
    if holder.get("unreadable"):
        return (f"{folder} is in use: {describe(holder)}; it is taken over once older than the stale limit "
                f"({STALE_ENV}), or delete it if no layerdrop command runs there")
    return (f"{folder} is in use: {describe(holder)}; wait for it to finish, or stop it (a lock whose holder "
            "died is taken over)")


def in_use(folder: str | os.PathLike, stale_after: float | None = None) -> str | None:
    """The holder line of a live lock on ``folder`` or on a folder above it (a
    `layerdrop export --out <run>/export` while that run trains); None when free or
    held by this command or its parent."""
    limit = stale_after if stale_after is not None else stale_seconds()
    current = Path(os.path.realpath(folder))
    for candidate in (current, *current.parents):
        holder = read_holder(candidate / LOCK_FILE)
        if holder is None or (holder.get("token") and holder.get("token") in _held_tokens().values()):
            continue
        if stale_reason(holder, limit) is None:
            return in_use_message(candidate, holder)
    return None


# ----------------------------------------------------------------- processes
def process_runs(pid: int, ticks: int | None) -> bool:
    """Whether ``pid`` runs on this host and is the same process (its start time, in
    clock ticks since boot, tells a reused pid apart where /proc has it)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's live process
    current = start_ticks(pid)
    return ticks is None or current is None or current == ticks


def start_ticks(pid: int) -> int | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return int(fields[19])  # field 22 of proc(5): starttime
    except (OSError, IndexError, ValueError):
        return None


def stale_seconds() -> float:
    value = os.environ.get(STALE_ENV)
    try:
        return float(value) if value else DEFAULT_STALE_SECONDS
    except ValueError:
        raise ValueError(f"{STALE_ENV}={value!r} is invalid: give a number of seconds") from None


def now_text() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


# ------------------------------------------------------- what children inherit
def _held_tokens() -> dict[str, str]:
    entries = [e for e in os.environ.get(HELD_ENV, "").split(os.pathsep) if "=" in e]
    return dict(entry.rsplit("=", 1) for entry in entries)


def inherited_token(folder: Path) -> str | None:
    return _held_tokens().get(str(folder))


_ENVIRONMENT = threading.Lock()  # a sweep's threads take and release run locks at once


def _export_held(folder: Path, token: str | None) -> None:
    with _ENVIRONMENT:
        _set_held(folder, token)


def _set_held(folder: Path, token: str | None) -> None:
    held = _held_tokens()
    if token is None:
        held.pop(str(folder), None)
    else:
        held[str(folder)] = token
    if held:
        os.environ[HELD_ENV] = os.pathsep.join(f"{k}={v}" for k, v in held.items())
    else:
        os.environ.pop(HELD_ENV, None)


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:
        return None


__all__ = ["RunLock", "RunFolderInUse", "in_use", "read_holder", "LOCK_FILE", "HELD_ENV", "STALE_ENV"]

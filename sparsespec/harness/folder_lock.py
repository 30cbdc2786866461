"""One run per output folder: a lock held for the run's whole life, and a note of who holds it.

The lock is `fcntl.flock` (filelock's FileLock), so the kernel drops it when its process dies, even
by `kill -9`: a killed run never blocks its own resume. The note (pid, host, start time) sits next to
the lock file, so a second run into the folder can say whose run is in the way.
"""
from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

from filelock import FileLock, Timeout

from sparsespec.errors import ConfigError

from sparsespec.harness.results import read_json, write_json

LOCK_FILE = ".run.lock"
HOLDER_FILE = ".run.lock.json"   # the note of the lock's holder; left in place, overwritten by the next one
NOTE_WAIT_S = 5.0                # the holder writes its note just after taking the lock: wait this long for it


# Folders claimed for this process's run before Hydra writes into them (`claim_folder`): the run's
# own `hold_folder` then finds its lock already held.
_CLAIMED: dict[Path, FileLock] = {}


def _acquire(folder: Path) -> FileLock:
    """`folder`'s lock, taken; ConfigError at once if a run holds it."""
    lock = FileLock(folder / LOCK_FILE)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        raise ConfigError(f"{folder} is in use by another run ({lock_holder(folder)}); wait for it to end, "
                          f"or choose another hydra.run.dir") from None
    write_json(folder / HOLDER_FILE, {"pid": os.getpid(), "host": socket.gethostname(),
                                      "started": datetime.now(timezone.utc).isoformat(timespec="seconds")})
    return lock


def claim_folder(folder: Path) -> None:
    """Take `folder`'s lock for this process's run until `release_folder` (or the process ends), so a
    second run is refused before it writes anything there (Hydra's `.hydra/` included)."""
    folder = Path(folder)
    if folder.resolve() not in _CLAIMED:
        _CLAIMED[folder.resolve()] = _acquire(folder)


def release_folder(folder: Path) -> None:
    lock = _CLAIMED.pop(Path(folder).resolve(), None)
    if lock is not None:
        lock.release()


@contextlib.contextmanager
def hold_folder(folder: Path) -> Iterator[None]:
    """Hold `folder` for the duration of the block (already held if this process claimed it); raise
    ConfigError at once if another run holds it."""
    folder = Path(folder)
    if folder.resolve() in _CLAIMED:
        yield
        return
    lock = _acquire(folder)
    try:
        yield
    finally:
        lock.release()


def lock_holder(folder: Path, wait_s: float = NOTE_WAIT_S) -> str:
    """Who holds `folder`'s lock, in words, from the holder's note.

    The holder writes its note just after it takes the lock, so a run refused in between finds no
    note, or the note of an earlier run that has ended. Poll up to `wait_s` for a note naming a live
    holder (a process of this host that exists, or any process of another host)."""
    note = Path(folder) / HOLDER_FILE
    deadline = time.monotonic() + wait_s
    while True:
        holder = read_json(note)
        if holder is not None and _names_live_holder(holder):
            return f"pid {holder['pid']} on {holder['host']}, started {holder.get('started', '?')}"
        if time.monotonic() >= deadline:
            return f"holder not known: {note.name} is missing, unreadable or names a run that has ended"
        time.sleep(0.05)


def _names_live_holder(holder: dict) -> bool:
    pid, host = holder.get("pid"), holder.get("host")
    if not isinstance(pid, int) or not isinstance(host, str):
        return False
    if host != socket.gethostname():
        return True                       # cannot look at another host's processes; trust its note
    try:
        os.kill(pid, 0)                   # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return False
    except PermissionError:               # exists, owned by someone else
        return True
    return True

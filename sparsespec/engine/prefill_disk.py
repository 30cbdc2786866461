"""Prefills kept on disk, for later processes (`prefill_cache_dir`): a resumed run, the next chunk of
a sweep, another method's run on the same prompts.

One file per key (the model's identity and the prompt's ids, `PrefillMemo.key_of`), named by a hash
of it: a `torch.save` of plain tensors and numbers, read back with `weights_only=True`. A file is
written to a temporary name in the same folder and renamed into place, so a reader finds a whole
file or none, whatever other processes do. A file's modification time is its last use; beyond
`max_bytes`, the least recently used files are deleted, under a lock on the folder (filelock), so
concurrent runs keep the cap. A file that cannot be read, or holds another key or format, is
ignored with one warning line (the caller prefills again and overwrites it).
"""
from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import tempfile
import time
from pathlib import Path

import torch
from filelock import FileLock
from sparsespec.errors import describe

log = logging.getLogger(__name__)

SUFFIX = ".prefill.pt"
FORMAT = 1          # the stored fields' version: a file of another version is ignored and rewritten
STALE_S = 3600      # a temporary file this old was left by a writer that died: no write takes an hour


class PrefillDisk:
    """A folder of prefill files, at most `max_bytes` of them (from the moment it is opened)."""

    def __init__(self, folder, max_bytes: int):
        self.folder = Path(folder).expanduser()
        self.max_bytes = max_bytes
        self.folder.mkdir(parents=True, exist_ok=True)
        self.evict()

    def path_of(self, key: tuple[str, str]) -> Path:
        return self.folder / (hashlib.sha1("/".join(key).encode()).hexdigest() + SUFFIX)

    def load(self, key: tuple[str, str], device) -> dict | None:
        """The fields saved under `key`, on `device`; None when no file holds them (none, or one that is
        unreadable or of another key or format: one warning line)."""
        path = self.path_of(key)
        try:
            state = torch.load(path, map_location=device, weights_only=True)
        except FileNotFoundError:
            return None
        except Exception as error:      # a torn, truncated or foreign file: any unpickling error
            log.warning("prefill cache: ignoring unreadable %s (%s); prefilling again", path, describe(error))
            return None
        if not isinstance(state, dict) or state.get("format") != FORMAT or state.get("key") != list(key):
            log.warning("prefill cache: ignoring %s, which holds another key or format; prefilling again", path)
            return None
        with contextlib.suppress(FileNotFoundError):    # evicted by another process meanwhile: still read
            os.utime(path)                               # its last use
        return state

    def save(self, key: tuple[str, str], fields: dict, nbytes: int) -> None:
        """Keep `fields` (tensors and numbers, about `nbytes`) under `key`, then evict down to the cap.
        A prefill larger than the cap is not written; a failed write is one warning line."""
        if nbytes > self.max_bytes:
            return
        path = self.path_of(key)
        handle, temporary = tempfile.mkstemp(dir=self.folder, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(handle, "wb") as file:
                torch.save({"format": FORMAT, "key": list(key), **fields}, file)
            os.replace(temporary, path)
        except OSError as error:        # a full or read-only disk: the run goes on without the file
            Path(temporary).unlink(missing_ok=True)
            log.warning("prefill cache: could not write %s (%s); it is not kept", path, describe(error))
            return
        self.evict()

    def evict(self) -> None:
        """Delete the least recently used files until the folder's prefill files fit `max_bytes`, and
        temporary files left by writers that died."""
        with FileLock(self.folder / ".lock"):
            for path in self.folder.glob(".*" + SUFFIX + ".*.tmp"):
                with contextlib.suppress(FileNotFoundError):
                    if time.time() - path.stat().st_mtime > STALE_S:
                        path.unlink()
            files = []
            for path in self.folder.glob("*" + SUFFIX):
                with contextlib.suppress(FileNotFoundError):
                    stat = path.stat()
                    files.append((stat.st_mtime_ns, path.name, stat.st_size, path))
            total = sum(size for _, _, size, _ in files)
            for _, _, size, path in sorted(files):
                if total <= self.max_bytes:
                    break
                path.unlink(missing_ok=True)
                total -= size

    @property
    def nbytes(self) -> int:
        return sum(path.stat().st_size for path in self.folder.glob("*" + SUFFIX))

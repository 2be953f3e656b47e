"""One process per folder: an OS lock on a run directory (``cosmos-pl fit``) or a compare folder (``--out``).

:class:`FolderLock` takes ``flock(LOCK_EX | LOCK_NB)`` on ``FOLDER/.cosmos-pl.lock`` and holds it until
:meth:`FolderLock.release` or the end of the process: the kernel drops a flock when its last descriptor closes,
so a lock left by a killed process (SIGKILL, OOM kill, power cut of a network client) never blocks the next run.
While held, the file names the holder (process id, command line, start time), so a second process is refused
with one line that says who holds the folder; it is removed on release (a killed process leaves it behind,
unlocked and harmless). The descriptor is not inherited by child processes (Python opens
files non-inheritable), so the workers and pairs a run starts do not keep it alive.
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
import time
from pathlib import Path
from typing import Optional

from cosmos_pl.errors import UserError

__all__ = ["FolderLock", "FolderInUse", "LOCK_NAME", "unwritable"]

LOCK_NAME = ".cosmos-pl.lock"


class FolderInUse(UserError):
    """Another live process holds the folder's lock."""


def unwritable(path: Path, key: str, err: OSError) -> UserError:
    """The one-line error for a folder cosmos-pl cannot write (read-only, no permission, a full disk)."""
    why = err.strerror or str(err)
    return UserError(f"{key}={str(path)!r}: cannot write there ({why}); make it writable (e.g. chmod u+w), free "
                     f"space on its disk, or choose another {key}")


class FolderLock:
    """An exclusive lock on ``folder`` for this process (see the module docstring).

    Args:
        folder: an existing folder.
        key: the setting that named it (``--run_dir``, ``--resume``, ``--out``), for messages.
    """

    def __init__(self, folder: str | Path, key: str) -> None:
        self.folder, self.key = Path(folder), key
        self._fd: Optional[int] = None

    @property
    def path(self) -> Path:
        return self.folder / LOCK_NAME

    def acquire(self) -> "FolderLock":
        """Take the lock; returns self.

        Raises:
            FolderInUse: another process holds it (naming the process and what to do).
            UserError: the folder cannot be written (naming it and the fix); this is the run's first write, so
                a read-only folder is refused before any data is loaded.
        """
        while True:
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
            except OSError as err:
                raise unwritable(self.folder, self.key, err) from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _holder(fd)
                os.close(fd)
                raise FolderInUse(f"{self.key}={str(self.folder)!r}: in use by {holder}; wait for it to finish, or "
                                  "stop it (a lock left by a process that was killed is released with it)") from None
            if _same_file(fd, self.path):
                break
            os.close(fd)  # the holder removed the file between our open and our lock: take the new one
        try:
            os.ftruncate(fd, 0)
            os.write(fd, json.dumps({"pid": os.getpid(), "command": " ".join(sys.argv),
                                     "since": time.strftime("%Y-%m-%d %H:%M:%S")}).encode())
        except OSError as err:  # a full disk or a quota: the folder cannot take the run's files either
            os.close(fd)
            raise unwritable(self.folder, self.key, err) from None
        self._fd = fd
        return self

    def release(self) -> None:
        """Remove the lock file and drop the lock (a process that opened the old file meanwhile sees it is gone,
        :meth:`acquire`, and takes a new one)."""
        if self._fd is not None:
            try:
                self.path.unlink(missing_ok=True)
            except OSError:  # the folder became read-only: the unlocked file is harmless
                pass
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> "FolderLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def _same_file(fd: int, path: Path) -> bool:
    try:
        return os.fstat(fd).st_ino == os.stat(path).st_ino
    except FileNotFoundError:
        return False


def _holder(fd: int) -> str:
    try:
        info = json.loads(os.pread(fd, 4096, 0).decode() or "{}")
    except (OSError, ValueError):
        info = {}
    if not info.get("pid"):
        return "another process"
    return f"process {info['pid']} (`{info.get('command', '?')}`, since {info.get('since', '?')})"

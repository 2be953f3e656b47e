"""Files written atomically (temporary file, fsync, rename): a reader sees the old file or the whole new one, never
half of it. A write that fails for lack of space or permission is a :class:`WriteFailed` naming the file and the
fix, not a traceback. Files get the usual permissions (``0o666`` less the umask), like any file the user creates.
"""

from __future__ import annotations

import errno
import os
import secrets
from pathlib import Path
from typing import Any, Callable, Optional

from cosmos_pl.errors import UserError

__all__ = ["WriteFailed", "atomic_write", "atomic_write_text", "atomic_save", "atomic_save_figure"]

_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


class WriteFailed(UserError):
    """A result or checkpoint file could not be written: the disk is full, or the folder is not writable."""


def _write_error(path: Path, err: BaseException) -> Optional[WriteFailed]:
    """The user's error behind a failed write (no space, no permission, a read-only file system), else None.

    torch's writer may raise a RuntimeError whose message carries the OS error in its middle, with the OSError
    as its cause or context: both are looked at."""
    seen: Optional[BaseException] = err
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in _NO_SPACE:
            return WriteFailed(f"no space left on the disk of {path.parent} while writing {path.name}: free space "
                               "there, or move the run directory to a disk with room")
        if isinstance(seen, OSError) and seen.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            return WriteFailed(f"cannot write {path} ({seen.strerror}): make {path.parent} writable, or move the "
                               "run directory")
        if "No space left on device" in str(seen):
            return WriteFailed(f"no space left on the disk of {path.parent} while writing {path.name}: free space "
                               "there, or move the run directory to a disk with room")
        seen = seen.__cause__ or seen.__context__
    return None


def _create(path: Path) -> int:
    """Create ``path`` for writing, as open() creates files: mode 0o666 less the umask (tempfile.mkstemp would
    force 0o600)."""
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)


def atomic_write(path: Path, write: Callable[[Any], None], mode: str = "wb") -> None:
    """Call ``write(file)`` on a temporary file in ``path``'s folder, fsync it, then ``os.replace`` it onto
    ``path``: a reader sees the old file or the whole new one, never half of it.

    Raises:
        WriteFailed: no space or no permission (the temporary file is removed; ``path`` is untouched).
    """
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        while True:
            tmp = path.parent / f".{path.name}.{secrets.token_hex(4)}.tmp"
            try:
                fd = _create(tmp)
                break
            except FileExistsError:
                continue
    except OSError as err:
        raise _write_error(path, err) or err from None
    try:
        with os.fdopen(fd, mode, **({"encoding": "utf-8", "newline": ""} if "b" not in mode else {})) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as err:
        tmp.unlink(missing_ok=True)
        failed = _write_error(path, err) if isinstance(err, Exception) else None
        if failed is not None:
            raise failed from None
        raise


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically (temporary file, fsync, rename)."""
    atomic_write(path, lambda f: f.write(text), "w")


def atomic_save(obj: Any, path: Path) -> None:
    """``torch.save(obj)`` to ``path`` atomically (temporary file, fsync, rename)."""
    import torch

    atomic_write(path, lambda f: torch.save(obj, f), "wb")


def atomic_save_figure(fig: Any, path: Path, dpi: int = 120) -> None:
    """A matplotlib figure to ``path`` as PNG atomically (temporary file, fsync, rename)."""
    atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=dpi), "wb")

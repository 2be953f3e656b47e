"""The process's open-file limit: raised at start where the system allows more, and said plainly where hit.

Most Linux desktops, many containers and many Slurm nodes start a shell with a soft limit of 1,024 open files and a
far higher hard limit (systemd's default is 1024:524288). A process may raise its own soft limit up to the hard
limit, as many tools do at start; cosmos-pl does (:func:`raise_open_file_limit`), and its workers inherit it. Where
the limit is hit all the same, :func:`open_file_limit_line` says so in one line naming ``ulimit -n``, in place of a
traceback. :func:`memory_available` is the machine's available memory (what a worker pool or a server-side model
may take on the CPU).
"""

from __future__ import annotations

import errno
from typing import Optional

__all__ = ["ResourceLimitError", "memory_available", "open_file_limit", "open_file_limit_line",
           "raise_open_file_limit", "too_many_open_files"]

try:
    import resource
except ImportError:  # Windows: no such limit to read or raise
    resource = None  # type: ignore[assignment]

from cosmos_pl.errors import UserError

#: The soft limit asked for where the hard limit is unlimited (macOS caps it at its OPEN_MAX, 10,240).
UNLIMITED_TARGET = 10240


class ResourceLimitError(UserError, OSError):
    """The run hit a limit of this machine or session (open files) that the user can raise."""


def open_file_limit() -> Optional[tuple[int, int]]:
    """``(soft, hard)`` open-file limits of this process (``-1`` for unlimited); None where there is none."""
    if resource is None:
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return (-1 if soft == resource.RLIM_INFINITY else soft), (-1 if hard == resource.RLIM_INFINITY else hard)


def raise_open_file_limit() -> Optional[tuple[int, int]]:
    """Raise this process's soft open-file limit to its hard limit (to :data:`UNLIMITED_TARGET` where that is
    unlimited); children started afterwards inherit it. Returns ``(before, after)`` when it changed, else None;
    never raises (a system that refuses keeps its limit)."""
    limits = open_file_limit()
    if limits is None:
        return None
    soft, hard = limits
    target = UNLIMITED_TARGET if hard == -1 else hard
    if soft == -1 or soft >= target:
        return None
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, resource.RLIM_INFINITY if hard == -1 else hard))
    except (ValueError, OSError):
        return None
    return soft, target


def too_many_open_files(err: BaseException) -> bool:
    """Whether ``err`` (or an exception it was raised from or during) is running out of file descriptors: an
    ``OSError`` with ``EMFILE``, or torch's ``RuntimeError`` whose text says "Too many open files"."""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, OSError) and err.errno in (errno.EMFILE, errno.ENFILE):
            return True
        if "Too many open files" in str(err):
            return True
        err = err.__cause__ or err.__context__
    return False


def open_file_limit_line() -> str:
    """What to say when the open-file limit was hit: the limits, and the ``ulimit -n`` to run (four times the soft
    limit, at least 4,096), or the hard limit to ask an administrator for where that is lower."""
    limits = open_file_limit()
    if limits is None:
        return "too many open files: raise this system's limit on open files and run again"
    soft, hard = limits
    need = max(4096, 4 * soft)
    text = (f"too many open files: this process may hold {soft} (ulimit -n; hard limit "
            f"{'unlimited' if hard == -1 else hard}); run `ulimit -n {need}` in the shell before cosmos-pl")
    if hard != -1 and hard < need:
        text += (f", which needs a hard limit of {need} or more: ask your administrator (nofile in "
                 "/etc/security/limits.conf, LimitNOFILE in systemd, or the container's --ulimit nofile)")
    return text


def memory_available() -> Optional[int]:
    """This machine's available memory in bytes (``MemAvailable`` of ``/proc/meminfo``); None where unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None

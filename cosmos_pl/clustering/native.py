"""The compiled L1 kernel (``l1_kernel.c``): built with the machine's C compiler on first use, then reused.

Pairwise L1 distances cost N^2/2 * n * M absolute differences (1.25e11 at N = 500, |U| = 10,000, M = 100), and a
blocked C loop does many times more of them per second than torch's ``cdist(p=1)`` (docs/performance.md, "Choices
in the code"). The shared library is compiled once per machine into ``$COSMOS_PL_CACHE`` (default ``~/.cache/cosmos-pl``) under a hash of
the source and the compiler, written atomically, and loaded with ctypes. Without a working C compiler (or with
``COSMOS_PL_NATIVE=0``) :func:`load` returns None and the caller falls back to torch, with the same results to
about 1e-6 relative.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
import warnings
from functools import lru_cache
from pathlib import Path
from typing import Optional

import numpy as np

__all__ = ["load", "l1_upper", "cache_dir"]

_SOURCE = Path(__file__).with_name("l1_kernel.c")
_FLAG_SETS = (["-O3", "-march=native", "-fopenmp"], ["-O3", "-fopenmp"], ["-O3"])


def cache_dir() -> Path:
    """Where compiled kernels are kept: ``$COSMOS_PL_CACHE``, else ``$XDG_CACHE_HOME/cosmos-pl``, else
    ``~/.cache/cosmos-pl``."""
    if os.environ.get("COSMOS_PL_CACHE"):
        return Path(os.environ["COSMOS_PL_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "cosmos-pl"


def _compile(compiler: str, flags: list[str], target: Path) -> bool:
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        out = Path(tmp) / target.name
        cmd = [compiler, *flags, "-shared", "-fPIC", str(_SOURCE), "-o", str(out), "-lm"]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if done.returncode != 0 or not out.is_file():
            return False
        os.replace(out, target)  # atomic: a reader sees no library or the whole one
    return True


@lru_cache(maxsize=1)
def load() -> Optional[ctypes.CDLL]:
    """The compiled kernel, or None (no compiler, a failed build, ``COSMOS_PL_NATIVE=0``); never raises."""
    if os.environ.get("COSMOS_PL_NATIVE", "1") == "0":
        return None
    compiler = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc") or shutil.which("clang")
    if compiler is None:
        return None
    for flags in _FLAG_SETS:
        key = hashlib.sha256(_SOURCE.read_bytes() + f"|{compiler}|{' '.join(flags)}".encode()).hexdigest()[:16]
        target = cache_dir() / f"l1_kernel-{key}.so"
        try:
            if not target.is_file() and not _compile(compiler, flags, target):
                continue
            lib = ctypes.CDLL(str(target))
            lib.cosmos_l1_upper.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
            lib.cosmos_l1_upper.restype = None
            return lib
        except (OSError, subprocess.SubprocessError) as err:
            warnings.warn(f"cosmos-pl: the C kernel for client distances did not build with {flags} ({err}); "
                          "trying the next flags or torch", RuntimeWarning, stacklevel=2)
    return None


def l1_upper(x: np.ndarray) -> Optional[np.ndarray]:
    """``[N, N]`` float64 with ``out[i, j] = sum_k |x[i, k] - x[j, k]|`` for ``j > i`` (zero elsewhere), for a
    C-contiguous float32 ``x`` ``[N, D]``; None when the kernel is unavailable. Threads: ``OMP_NUM_THREADS``
    (default: every core)."""
    lib = load()
    if lib is None:
        return None
    x = np.ascontiguousarray(x, dtype=np.float32)
    n, d = x.shape
    out = np.zeros((n, n), dtype=np.float64)
    lib.cosmos_l1_upper(x.ctypes.data, n, d, out.ctypes.data)
    return out

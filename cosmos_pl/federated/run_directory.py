"""The run directory: one run's files, each written atomically (temp file + rename), so none is ever half-written.

A run directory holds one run only: :meth:`RunDirectory.prepare` refuses a folder that already holds another run's
result files unless told to overwrite them (then it removes them first), and :meth:`RunDirectory.unique` makes a
new folder that no other run has, even for runs started in the same second. Files get the usual permissions
(``0o666`` less the umask), like any file the user creates.
"""

from __future__ import annotations

import json
import math
import os
import secrets
import shutil
from pathlib import Path
from typing import Any, Callable

from cosmos_pl.errors import ConfigError

__all__ = ["RunDirectory", "RESULT_FILES", "atomic_write_text", "atomic_save", "atomic_save_figure"]

# What a run writes; a folder holding any of them holds a run (wandb/ is removed with them on overwrite).
RESULT_FILES = ("config.yaml", "partition.json", "clusters.json", "metrics.csv", "clients.csv", "summary.json")


def _atomic_write(path: Path, write: Callable[[Any], None], mode: str) -> None:
    """Call ``write(file)`` on a temporary file in ``path``'s folder, fsync it, then ``os.replace`` it onto
    ``path``: a reader sees the old file or the whole new one, never half of it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    while True:
        tmp = path.parent / f".{path.name}.{secrets.token_hex(4)}.tmp"
        try:
            # created like open() creates files: mode 0o666 less the umask (tempfile.mkstemp would force 0o600)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            break
        except FileExistsError:
            continue
    try:
        with os.fdopen(fd, mode, **({"encoding": "utf-8", "newline": ""} if "b" not in mode else {})) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically (temporary file, fsync, rename)."""
    _atomic_write(path, lambda f: f.write(text), "w")


def atomic_save(obj: Any, path: Path) -> None:
    """``torch.save(obj)`` to ``path`` atomically (temporary file, fsync, rename)."""
    import torch

    _atomic_write(path, lambda f: torch.save(obj, f), "wb")


def atomic_save_figure(fig: Any, path: Path, dpi: int = 120) -> None:
    """A matplotlib figure to ``path`` as PNG atomically (temporary file, fsync, rename)."""
    _atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=dpi), "wb")


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return None  # JSON has no NaN; null means "not defined" (e.g. teacher accuracy at round 0)
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if hasattr(value, "tolist"):
        return _jsonable(value.tolist())
    return value


def _mkdir(path: Path, key: str) -> None:
    """``path.mkdir(parents=True, exist_ok=True)``; a file in the way, or no permission, is a ConfigError."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        what = "is an existing file" if path.is_file() else f"cannot be created ({err.strerror or err})"
        raise ConfigError(f"{key}={str(path)!r}: {what}; give a folder path you can write to") from None


class RunDirectory:
    """Files of one experiment: config.yaml, partition.json, clusters.json, metrics.csv, clients.csv, summary.json.

    ``RunDirectory(path)`` uses ``path`` as it is (creating it); a run started from the CLI gets its folder from
    :meth:`prepare` or :meth:`unique`, which make sure no other run's files are in it.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)

    @classmethod
    def prepare(cls, path: str | Path, overwrite: bool = False, key: str = "--run_dir") -> RunDirectory:
        """The folder ``path`` for a new run, created if missing.

        Raises:
            ConfigError: ``path`` is a file (or lies under one) or cannot be created; or it holds another run's
                result files (:data:`RESULT_FILES`) and ``overwrite`` is false. With ``overwrite`` those files
                and the ``wandb/`` folder are removed first; other files (e.g. compare's pair.yaml) are kept.
        """
        path = Path(path)
        _mkdir(path, key)
        found = [name for name in RESULT_FILES if (path / name).exists()]
        if found and not overwrite:
            raise ConfigError(f"{key}={str(path)!r}: already holds the files of another run ({', '.join(found)}); "
                              f"choose a new {key}, or pass --overwrite true to replace them")
        if overwrite:
            for name in found:
                (path / name).unlink()
            shutil.rmtree(path / "wandb", ignore_errors=True)
        return cls(path)

    @classmethod
    def unique(cls, base: str | Path, key: str = "--run_dir") -> RunDirectory:
        """A new, empty folder ``base``, or ``base-2``, ``base-3``, ... when that exists: created atomically
        (``mkdir`` without ``exist_ok``), so two runs started in the same second never share one."""
        base = Path(base)
        _mkdir(base.parent, key)
        for n in range(1, 10_000):
            path = base if n == 1 else base.with_name(f"{base.name}-{n}")
            try:
                path.mkdir()
                return cls(path)
            except FileExistsError:
                continue
        raise ConfigError(f"{key}: no free folder name after {base}-9999; pass --run_dir")

    def write_text(self, name: str, text: str) -> Path:
        target = self.path / name
        atomic_write_text(target, text)
        return target

    def write_json(self, name: str, data: Any) -> Path:
        return self.write_text(name, json.dumps(_jsonable(data), indent=2, sort_keys=False) + "\n")

"""The run directory: every file written atomically (temp file + rename), so none is ever half-written."""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any, Callable

__all__ = ["RunDirectory", "atomic_write_text", "atomic_save"]


def _atomic_write(path: Path, write: Callable[[Any], None], mode: str) -> None:
    """Call ``write(file)`` on a temporary file in ``path``'s folder, fsync it, then ``os.replace`` it onto
    ``path``: a reader sees the old file or the whole new one, never half of it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, mode, **({"encoding": "utf-8", "newline": ""} if "b" not in mode else {})) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically (temporary file, fsync, rename)."""
    _atomic_write(path, lambda f: f.write(text), "w")


def atomic_save(obj: Any, path: Path) -> None:
    """``torch.save(obj)`` to ``path`` atomically (temporary file, fsync, rename)."""
    import torch

    _atomic_write(path, lambda f: torch.save(obj, f), "wb")


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


class RunDirectory:
    """Files of one experiment: config.yaml, partition.json, clusters.json, metrics.csv, clients.csv, summary.json."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)

    def write_text(self, name: str, text: str) -> Path:
        target = self.path / name
        atomic_write_text(target, text)
        return target

    def write_json(self, name: str, data: Any) -> Path:
        return self.write_text(name, json.dumps(_jsonable(data), indent=2, sort_keys=False) + "\n")

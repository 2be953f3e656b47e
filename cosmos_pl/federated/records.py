"""The run directory: every file written atomically (temp file + rename), so none is ever half-written."""

from __future__ import annotations

import csv
import io
import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["RunDirectory", "atomic_write_text"]


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` via a temporary file in the same folder and ``os.replace``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


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
    """Files of one experiment: config.yaml, partition.json, clusters.json, metrics.csv, summary.json."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self._rows: list[dict[str, Any]] = []

    def write_text(self, name: str, text: str) -> Path:
        target = self.path / name
        atomic_write_text(target, text)
        return target

    def write_json(self, name: str, data: Any) -> Path:
        return self.write_text(name, json.dumps(_jsonable(data), indent=2, sort_keys=False) + "\n")

    def append_metrics(self, row: dict[str, Any]) -> Path:
        """Add one round's row and rewrite metrics.csv whole (atomic; rows are few)."""
        self._rows.append(row)
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=list(self._rows[0].keys()), lineterminator="\n")
        writer.writeheader()
        for r in self._rows:
            writer.writerow({k: ("" if v is None else (f"{v:.6f}" if isinstance(v, float) else v)) for k, v in r.items()})
        return self.write_text("metrics.csv", buf.getvalue())

"""Round checkpoints: everything needed to continue a run after its last complete round.

After every round the runner writes ``RUN_DIR/checkpoints/round-XXXX.pt`` atomically (temporary file, fsync,
rename): the clients' models, the algorithm's state (clusters, teachers), the records so far, the runner's
timers and failures, the global random states, the config's hash and the W&B run id. Loading uses
``torch.load(weights_only=True)``: a checkpoint holds tensors and plain values only and never runs code. The
newest ``keep`` checkpoints are kept. A newest checkpoint that cannot be read (torn by a crash of the disk, or
edited) is skipped with a warning for the one before it.
"""

from __future__ import annotations

import hashlib
import random
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch

from cosmos_pl.errors import UserError, check
from cosmos_pl.files import atomic_save

__all__ = ["CheckpointConfig", "FORMAT", "config_hash", "checkpoint_dir", "save", "load_latest", "plain",
           "capture_rng", "restore_rng", "NoCheckpoint"]

FORMAT = 1
_NAME = re.compile(r"^round-(\d{4,})\.pt$")


@dataclass
class CheckpointConfig:
    """Round checkpoints of a run (``RUN_DIR/checkpoints``); ``cosmos-pl fit --resume RUN_DIR`` continues from them.

    Args:
        keep: how many of the newest round checkpoints to keep (>= 1); older ones are deleted.
    """

    keep: int = 2

    def __post_init__(self) -> None:
        """Raises ConfigError for keep < 1."""
        check(self.keep >= 1, "checkpoint.keep", self.keep, "must be >= 1 (the newest round is needed to resume)")


class NoCheckpoint(UserError):
    """A run directory without a readable checkpoint to resume from."""


def config_hash(config_yaml: str) -> str:
    """SHA-256 (16 hex digits) of the run's resolved config.yaml text."""
    return hashlib.sha256(config_yaml.encode()).hexdigest()[:16]


def checkpoint_dir(run_dir: Path) -> Path:
    return Path(run_dir) / "checkpoints"


def plain(value: Any) -> Any:
    """``value`` with NumPy arrays as tensors and NumPy scalars as Python numbers, so that
    ``torch.load(weights_only=True)`` can read it back."""
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        out = [plain(v) for v in value]
        return out if isinstance(value, list) else tuple(out)
    if isinstance(value, np.ndarray):
        return torch.from_numpy(value.copy())
    if isinstance(value, np.generic):
        return value.item()
    return value


def capture_rng() -> dict[str, Any]:
    """The global random states (Python, NumPy, torch CPU); every stage seeds itself, these are kept so that
    anything unseeded continues as in an uninterrupted run."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    return {"python": random.getstate(), "numpy": (name, torch.from_numpy(keys.copy()), pos, has_gauss, cached),
            "torch": torch.get_rng_state()}


def restore_rng(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, keys.numpy(), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])


def _rounds(folder: Path) -> list[tuple[int, Path]]:
    found = []
    for path in folder.glob("round-*.pt"):
        m = _NAME.match(path.name)
        if m:
            found.append((int(m.group(1)), path))
    return sorted(found)


def save(run_dir: Path, rnd: int, state: dict[str, Any], keep: int = 2) -> Path:
    """Write round ``rnd``'s checkpoint atomically, then delete all but the newest ``keep``; returns its path."""
    folder = checkpoint_dir(run_dir)
    path = folder / f"round-{rnd:04d}.pt"
    atomic_save(plain({"format": FORMAT, "round": rnd, **state}), path)
    for _, old in _rounds(folder)[:-keep]:
        old.unlink(missing_ok=True)
    return path


def load_latest(run_dir: Path) -> tuple[dict[str, Any], Path]:
    """The newest readable checkpoint and its path; an unreadable newer one is skipped with a warning.

    Raises:
        NoCheckpoint: the folder holds no checkpoint, or none can be read.
    """
    folder = checkpoint_dir(run_dir)
    found = _rounds(folder)
    if not found:
        raise NoCheckpoint(f"--resume {run_dir}: no checkpoint in {folder} (the run stopped before round 0 ended, "
                           "or it predates checkpoints); start it again without --resume, in this folder with --overwrite true")
    for rnd, path in reversed(found):
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
            if not isinstance(state, dict) or state.get("format") != FORMAT or state.get("round") != rnd:
                raise ValueError(f"not a cosmos-pl round checkpoint of format {FORMAT}")
            return state, path
        except Exception as err:  # a torn or foreign file: try the one before it
            warnings.warn(f"checkpoint {path} cannot be read ({type(err).__name__}: {' '.join(str(err).split())[:200]}); "
                          "falling back to the one before it", RuntimeWarning, stacklevel=2)
    raise NoCheckpoint(f"--resume {run_dir}: none of the checkpoints in {folder} can be read "
                       f"({', '.join(p.name for _, p in found)}); start the run again without --resume")


def latest_round(run_dir: Path) -> Optional[int]:
    """The newest checkpoint's round number (by file name), or None."""
    found = _rounds(checkpoint_dir(run_dir))
    return found[-1][0] if found else None

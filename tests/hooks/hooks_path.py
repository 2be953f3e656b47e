"""Test-only: the environment that makes a child process install the test hooks of this folder
(``sitecustomize.py``: the test faults and the audit of opened paths, each only when its variable is set)."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["FOLDER", "with_hooks"]

FOLDER = str(Path(__file__).resolve().parent)


def with_hooks(env: dict[str, str]) -> dict[str, str]:
    """``env`` with this folder first on ``PYTHONPATH``."""
    return {**env, "PYTHONPATH": os.pathsep.join([FOLDER, *filter(None, [env.get("PYTHONPATH")])])}

"""Weights & Biases: one run per experiment, stepped by round (pitfall 12), offline unless asked otherwise."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

__all__ = ["Tracker"]


class Tracker:
    """A thin wrapper over one ``wandb`` run; with mode 'disabled' nothing is imported or written.

    Args:
        mode: 'offline', 'online' or 'disabled'.
        run_dir: the run directory; W&B files go to ``run_dir/wandb``.
        config: the resolved experiment config (a plain dict).
        project, entity, name, tags: passed to ``wandb.init``.
    """

    def __init__(self, mode: str, run_dir: Path, config: dict[str, Any], project: str,
                 entity: str | None, name: str | None, tags: list[str]) -> None:
        self.run = None
        if mode == "disabled":
            return
        import wandb

        os.environ.setdefault("WANDB_SILENT", "true")
        self.run = wandb.init(
            mode=mode, dir=str(run_dir), project=project, entity=entity,
            name=name or run_dir.name, tags=tags, config=config, reinit="finish_previous",
        )
        self.run.define_metric("round")
        self.run.define_metric("*", step_metric="round")

    def log_round(self, row: dict[str, Any]) -> None:
        if self.run is not None:
            self.run.log({k: v for k, v in row.items() if isinstance(v, (int, float)) and v is not None})

    def summary(self, summary: dict[str, Any]) -> None:
        if self.run is not None:
            for key in ("final", "best", "local_only"):
                if key in summary:
                    self.run.summary[key] = summary[key]

    def finish(self) -> None:
        if self.run is not None:
            self.run.finish()
            self.run = None

"""A comparison in Weights & Biases: its pairs' runs grouped, and its table in a run of its own.

Every pair's W&B run gets ``group`` (the comparison's name: ``--wandb.group`` when given, else the ``--out``
folder's name; a grid's pair that belongs to one grid point gets ``<name>/<point>``), ``job_type`` (the
algorithm's short name) and its whole resolved config, the seed included, so W&B's run table groups a
comparison's seeds of one algorithm. When the report is written, one more run (``job_type`` 'comparison', named
``<name>-comparison``, its files under ``OUT/wandb``) logs ``comparison.csv`` as the W&B table ``comparison`` (the
same numbers as ``comparison.md``) and, for a grid, every point's rows as the table ``grid`` with a ``point``
column (``grid.md``'s numbers). Offline by default, as every run: ``wandb sync OUT/runs/*/wandb/offline-run-*
OUT/wandb/offline-run-*`` uploads a comparison later.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import yaml
from jsonargparse import Namespace

__all__ = ["comparison_name", "with_group", "TableRun", "table_run", "log_comparison"]


def comparison_name(cfg: Namespace, out: Path) -> str:
    """The W&B group of a comparison: ``--wandb.group`` when given, else the ``--out`` folder's name."""
    return str(cfg.wandb.group or out.resolve().name)


def with_group(config_yaml: str, group: str) -> str:
    """A pair's ``fit`` config (YAML) with ``wandb.group`` set to ``group`` (a grid's shared pair is regrouped
    under the comparison's name once the grid knows it serves several points)."""
    config = yaml.safe_load(config_yaml)
    config.setdefault("wandb", {})["group"] = group
    return yaml.safe_dump(config, sort_keys=False)


@dataclass(frozen=True)
class TableRun:
    """The W&B settings of a comparison's table run: its ``name`` (the comparison's, :func:`comparison_name`),
    ``mode`` (``offline``, ``online`` or ``disabled``), ``project``, ``entity`` (None: the default), ``tags`` and
    the report's ``headline_metric``."""

    name: str
    mode: str
    project: str
    entity: Optional[str]
    tags: tuple[str, ...]
    headline_metric: str


def table_run(cfg: Namespace, out: Path) -> TableRun:
    """The table run of the comparison ``cfg`` (the ``compare`` config) writing into ``out``."""
    return TableRun(comparison_name(cfg, out), cfg.wandb.mode, cfg.wandb.project, cfg.wandb.entity,
                    tuple(cfg.wandb.tags), cfg.headline_metric)


def _read_csv(path: Path) -> tuple[list[str], list[list[Any]]]:
    """The header and rows of a comparison.csv; numbers as floats, empty cells (n/a) as None."""
    def cell(text: str) -> Any:
        if text == "":
            return None
        try:
            return float(text)
        except ValueError:
            return text

    with open(path, newline="") as f:
        reader = csv.reader(f)
        header = next(reader)
        return header, [[cell(c) for c in row] for row in reader]


def log_comparison(run: TableRun, out: Path, points: Optional[list[tuple[str, Path]]] = None) -> None:
    """Log the comparison's table run ``run`` (nothing with ``--wandb.mode disabled``): ``out/comparison.csv`` as the
    table ``comparison``; with ``points`` (a grid: each point's name and folder), every point's comparison.csv
    as the table ``grid``, a ``point`` column first.

    Raises:
        TrackingError: W&B cannot start (as for a run: online without a key, the server not reached).
    """
    if run.mode == "disabled":
        return
    from cosmos_pl.tracking import Tracker

    config = {"comparison": run.name, "out": str(out), "headline_metric": run.headline_metric}
    tracker = Tracker(run.mode, out, config, run.project, run.entity, f"{run.name}-comparison", list(run.tags),
                      group=run.name, job_type="comparison", by_round=False)
    try:
        if points is None:
            header, rows = _read_csv(out / "comparison.csv")
            tracker.log_table("comparison", header, rows)
        else:
            grid_rows: list[list[Any]] = []
            header = []
            for point, folder in points:
                header, rows = _read_csv(folder / "comparison.csv")
                grid_rows += [[point, *row] for row in rows]
            tracker.log_table("grid", ["point", *header], grid_rows)
    finally:
        tracker.finish()

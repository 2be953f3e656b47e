"""A comparison's plan: what ``cosmos-pl compare`` will run and report, resolved once from its config.

:func:`~cosmos_pl.compare.command.make_plan` reads the ``compare`` config and turns it into a :class:`ComparePlan`:
the pairs (:class:`Pair`, each with its ``fit`` config, its round-0 group and its W&B group), the points of a
``--grid`` (:class:`Point`; a comparison without a grid is one point, its folder ``--out``), the Slurm settings and
what the report needs (title, headline metric, the W&B table run's settings). The local launcher
(:mod:`~cosmos_pl.compare.pairs`), the Slurm launcher (:mod:`~cosmos_pl.compare.slurm`), the grid
(:mod:`~cosmos_pl.compare.grid`) and the report only read it. Which pairs an earlier compare finished is decided
here too (:func:`finished`, :meth:`ComparePlan.todo`). This module sits below the pairs and the grid, which do not
import each other.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import yaml

from cosmos_pl.compare.wandb_runs import TableRun
from cosmos_pl.config import SlurmConfig
from cosmos_pl.errors import ConfigError

__all__ = ["Pair", "Point", "ComparePlan", "finished", "run_settings"]

# keys of pair.yaml that do not change a run's numbers (and are absent from older pair.yaml files); failures
# settings only act when a client fails, which a finished run would have recorded; paths, so that an --out
# folder may be moved; the headline metric, which the report reads from metrics.csv (both metrics are there); W&B
# (where the run is logged, and its group, which names the comparison)
_NOT_RUN_SETTINGS = ("overwrite", "resume", "checkpoint", "failures", "run_dir", "round0_cache", "headline_metric",
                     "wandb")


@dataclass(frozen=True)
class Pair:
    """One (algorithm, seed) pair of a comparison: its run directory and its resolved ``fit`` config (YAML).

    Attributes:
        algorithm, seed: the pair (the algorithm's short name).
        run_dir: its run directory, ``OUT/runs/<algorithm>-seed<seed>`` (under a grid point's folder for a grid).
        config_yaml: its whole ``fit`` config, as ``pair.yaml`` holds it under :attr:`note`.
        note: YAML comment lines written above the config in ``pair.yaml``, naming the settings compare filled in
            (:func:`~cosmos_pl.compare.pairs.fill_executor`), empty when it filled none.
        round0_group: the settings that decide its round 0 (:func:`cosmos_pl.config.round0_key`), by which the
            Slurm launcher gives pairs one round-0 job; None with ``--launcher local``, where the round-0 cache
            itself matches them (the key resolves the device, which compare's own process then need not do).
        wandb_group: its W&B group (``wandb.group`` in :attr:`config_yaml`):
            :func:`~cosmos_pl.compare.wandb_runs.comparison_name`, or ``<name>/<point>`` for a grid's pair that
            belongs to one point.
    """

    algorithm: str
    seed: int
    run_dir: Path
    config_yaml: str
    note: str = ""
    round0_group: Optional[str] = None
    wandb_group: str = ""

    @property
    def label(self) -> str:
        return f"{self.algorithm} seed {self.seed}"

    @property
    def key(self) -> str:
        """The pair's run directory as text: unique in a comparison (a grid's points share labels)."""
        return str(self.run_dir)


@dataclass(frozen=True)
class Point:
    """One point of a comparison: the swept settings' values (``{}`` without ``--grid``), the folder its report
    goes to and its pairs (a pair shared by several points is the same object in each)."""

    values: dict[str, Any]
    folder: Path
    pairs: tuple[Pair, ...]


@dataclass(frozen=True)
class ComparePlan:
    """Everything a comparison runs and reports, checked before any pair starts; written by
    :func:`~cosmos_pl.compare.command.make_plan`, read by the launchers and the report.

    Attributes:
        out: the comparison's folder (``--out``).
        algorithms: the compared algorithms' names as given (``--algorithms`` or ``comparison.algorithms``).
        seeds: the seeds (``--seeds`` or ``comparison.seeds``).
        jobs: pairs run side by side on this machine (``--jobs``), >= 1.
        title: the report's title stem, the last ``--config`` file's name without suffix (``compare`` without one).
        headline_metric: ``top1`` or ``top5``, the metric of every number in the report.
        table_run: the comparison's W&B table run (:func:`~cosmos_pl.compare.wandb_runs.log_comparison`).
        slurm: the ``slurm`` group with ``--launcher slurm``, None with ``--launcher local``.
        grid: ``--grid``'s keys and values (:func:`~cosmos_pl.compare.grid.parse_grid`), empty without one.
        points: every point with its pairs; one point, folder ``out``, without a grid.
        unique: each distinct pair once (a grid's pair identical at several points runs once).
        skipped: per swept algorithm setting, the algorithms that do not take it.
        dry_run: ``--dry_run``: say what would run, run and write nothing.
    """

    out: Path
    algorithms: tuple[str, ...]
    seeds: tuple[int, ...]
    jobs: int
    title: str
    headline_metric: str
    table_run: TableRun
    slurm: Optional[SlurmConfig]
    grid: tuple[tuple[str, list[Any]], ...]
    points: tuple[Point, ...]
    unique: tuple[Pair, ...]
    skipped: dict[str, list[str]]
    dry_run: bool = False

    def todo(self) -> list[Pair]:
        """The distinct pairs an earlier compare did not finish (:func:`finished`), in plan order.

        Raises:
            ConfigError: a finished run of a pair made with a different config is in its run directory.
        """
        return [p for p in self.unique if not finished(p)]


def run_settings(text: str) -> Any:
    """A pair's ``fit`` config (YAML) without the keys that do not change its numbers: what a finished or
    interrupted run must match to be kept."""
    settings = yaml.safe_load(text) or {}
    for key in _NOT_RUN_SETTINGS:
        settings.pop(key, None)
    return settings


def finished(pair: Pair) -> bool:
    """Whether ``pair`` finished in an earlier compare (its ``summary.json`` is there) under the same settings.

    Raises:
        ConfigError: a finished run of the pair made with a different config is in its run directory.
    """
    summary, saved = pair.run_dir / "summary.json", pair.run_dir / "pair.yaml"
    if not summary.is_file():
        return False
    if not saved.is_file() or run_settings(saved.read_text()) != run_settings(pair.config_yaml):
        raise ConfigError(f"--out={str(pair.run_dir.parent.parent)!r}: {pair.run_dir} holds a finished run of "
                          f"{pair.label} made with a different config; compare into a new --out folder "
                          f"(or delete that run directory)")
    return True

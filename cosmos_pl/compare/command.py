"""``cosmos-pl compare``: read the algorithms, seeds and jobs, make every pair (at every grid point), run them and
write the report.

:func:`run_compare` checks everything before any pair starts (the names, the lists, every pair's config at every
point), then locks ``--out`` and runs the pairs (:mod:`cosmos_pl.compare.pairs`); with ``--grid`` the pairs of every
point of the grid (:mod:`cosmos_pl.compare.grid`), each distinct pair once, then each point's report and the grid's.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import yaml
from jsonargparse import ArgumentParser, Namespace
from rich.console import Console

from cosmos_pl.algorithms import algorithm_class
from cosmos_pl.compare.grid import (
    GridPlan,
    algorithm_setting,
    check_keys,
    grid_counts,
    grid_points,
    parse_grid,
    point_name,
    point_notes,
    print_grid_plan,
    settings_for,
    write_grid_report,
)
from cosmos_pl.compare.pairs import Pair, execute_pairs, finished, pair_configs, report_pairs
from cosmos_pl.compare.report import PairResult, summarize
from cosmos_pl.compare.wandb_runs import comparison_name, log_comparison, with_group
from cosmos_pl.config import CompareConfig, SlurmConfig, check_seed
from cosmos_pl.errors import ConfigError, check
from cosmos_pl.report import log_console
from cosmos_pl.runs.locks import FolderLock
from cosmos_pl.runs.run_directory import create_folder

__all__ = ["run_compare", "CompareResult", "plan_grid", "run_grid", "execute"]


@dataclass
class CompareResult:
    """What ``run_compare`` returns: the pairs and which failed (the CLI exits 1 when any did)."""

    pairs: list[PairResult]
    out: Path

    @property
    def failed(self) -> bool:
        return any(p.error is not None for p in self.pairs)


def _split(text: Optional[str], cast: Any, key: str) -> Optional[list]:
    if text is None:
        return None
    try:
        values = [cast(v.strip()) for v in str(text).split(",") if v.strip()]
    except ValueError:
        raise ConfigError(f"--{key}={text!r}: give a comma-separated list, e.g. --{key} "
                          f"{'0,1,2' if cast is int else 'cosmos,fedmd'}") from None
    check(len(values) > 0, f"--{key}", text, "the list is empty")
    return values


def run_compare(cfg: Namespace, parser: ArgumentParser, fit_parser: ArgumentParser,
                console: Optional[Console] = None) -> CompareResult:
    """Run (or resume) every pair of ``cfg`` (parsed by the ``compare`` ``parser``) and write the report into
    ``cfg.out``; each pair's config is a ``fit`` config checked with ``fit_parser``.

    Raises:
        ConfigError: an unknown algorithm name, a bad list, a bad pair setting, an ``--out`` that is a file, or
            a finished run made with a different config in ``--out``; all before any pair starts.
    """
    console = console or log_console()  # without a terminal: whole lines, not wrapped at 80 columns
    algorithms = _split(cfg.algorithms, str, "algorithms") or list(cfg.comparison.algorithms)
    for name in algorithms:
        algorithm_class(name, "--algorithms")
    seeds = _split(cfg.seeds, int, "seeds") or list(cfg.comparison.seeds)
    for seed in seeds:
        check_seed("--seeds", seed)
    jobs = cfg.jobs if cfg.jobs is not None else cfg.comparison.jobs
    check(jobs >= 1, "--jobs", jobs, "must be >= 1")
    out = Path(cfg.out)
    check(not out.is_file(), "--out", str(out), "is an existing file; give a folder")
    CompareConfig(**cfg.comparison.clone().as_dict())  # its own checks (algorithm names in settings, seeds, jobs)
    slurm = _slurm_settings(cfg)
    threads = None if slurm is None else slurm.cpus_per_job  # a Slurm job's pair uses its CPUs unless told otherwise
    grid = parse_grid(cfg.get("grid") or [])
    if grid:  # every point's pairs checked before anything is written
        plan = plan_grid(cfg, parser, fit_parser, out, algorithms, seeds, jobs, grid, threads)
        if cfg.get("dry_run"):
            print_grid_plan(plan, [p for p in plan.unique if not finished(p)], out, algorithms, seeds, jobs, console)
            return CompareResult([], out)
        create_folder(out, "--out")
        with FolderLock(out, "--out"):
            return CompareResult(run_grid(cfg, plan, out, algorithms, seeds, jobs, console, fit_parser), out)
    pairs = pair_configs(cfg, parser, fit_parser, out, algorithms, seeds, jobs, threads=threads)
    if cfg.get("dry_run"):
        todo = [p for p in pairs if not finished(p)]
        console.print(f"dry run: {_counts(pairs, todo, out, algorithms, seeds, jobs, 'would run')}")
        return CompareResult([], out)
    create_folder(out, "--out")
    with FolderLock(out, "--out"):  # one compare per folder: a second would delete the pairs the first runs
        return _run_pairs(cfg, pairs, out, algorithms, seeds, jobs, console, fit_parser)


def _slurm_settings(cfg: Namespace) -> Optional[SlurmConfig]:
    """The ``slurm`` group, built and checked, with ``--launcher slurm``; None with ``--launcher local``."""
    if cfg.get("launcher", "local") != "slurm":
        return None
    return SlurmConfig(**cfg.slurm.clone().as_dict())


def execute(cfg: Namespace, todo: list[Pair], jobs: int, out: Path, fit_parser: ArgumentParser,
            console: Console) -> dict[str, Optional[str]]:
    """Run the pairs ``todo`` where ``--launcher`` says: on this machine (``jobs`` side by side) or as Slurm
    jobs (:mod:`cosmos_pl.compare.slurm`); returns each pair's error (None: it finished) by its key. First the
    settings compare filled in for the pairs (:attr:`~cosmos_pl.compare.pairs.Pair.note`), once each."""
    for note in dict.fromkeys(p.note for p in todo if p.note):  # one unless a grid sweeps an executor setting
        console.print("\n".join(line[2:] for line in note.splitlines()), markup=False, highlight=False)
    slurm = _slurm_settings(cfg)
    if slurm is None:
        return execute_pairs(todo, jobs, console)
    from cosmos_pl.compare.slurm import execute_slurm

    if todo:  # the count line above speaks of --jobs, which Slurm's resources replace
        console.print(f"--launcher slurm ({slurm.cluster}): each pair a job of {slurm.cpus_per_job} CPU(s) and "
                      f"{slurm.gpus_per_job} GPU(s) for up to {slurm.time_min} min, --jobs does not apply")
    return execute_slurm(todo, slurm, out, fit_parser, console)


def _run_pairs(cfg: Namespace, pairs: list[Pair], out: Path, algorithms: list[str], seeds: list[int], jobs: int,
               console: Console, fit_parser: ArgumentParser) -> CompareResult:
    """:func:`run_compare` inside its locked ``--out`` folder: run what is not finished, then the report."""
    todo = [p for p in pairs if not finished(p)]
    console.print(f"[bold]cosmos-pl compare[/bold]: {_counts(pairs, todo, out, algorithms, seeds, jobs)}")
    errors = execute(cfg, todo, jobs, out, fit_parser, console)
    results = report_pairs(cfg, pairs, errors, out, algorithms, console)
    return CompareResult(results, out)


def _counts(pairs: list[Pair], todo: list[Pair], out: Path, algorithms: list[str], seeds: list[int], jobs: int,
            verb: str = "to run") -> str:
    """What a compare (or its dry run, ``verb`` "would run") is about to do, in one line."""
    return (f"{len(pairs)} pairs ({', '.join(dict.fromkeys(algorithms))} x seeds {seeds}); {len(pairs) - len(todo)} "
            f"already finished in {out}, {len(todo)} {verb}, {jobs} at a time")


def plan_grid(cfg: Namespace, parser: ArgumentParser, fit_parser: ArgumentParser, out: Path, algorithms: list[str],
              seeds: list[int], jobs: int, grid: list[tuple[str, list[Any]]],
              threads: Optional[int] = None) -> GridPlan:
    """Every point's pairs, each checked as ``fit`` checks a config; writes nothing. ``threads``: each pair's torch
    threads where ``executor.threads_per_worker`` is unset (a Slurm job's CPUs; None: this machine's cores split
    between ``jobs``; :func:`~cosmos_pl.compare.pairs.fill_executor`).

    Raises:
        ConfigError: a bad key (:func:`~cosmos_pl.compare.grid.check_keys`) or a bad value at some point, naming
            it."""
    skipped = check_keys(grid, cfg, algorithms)
    name = comparison_name(cfg, out)
    points, seen, unique = [], {}, []
    for point in grid_points(grid):
        point_cfg = cfg.clone()
        settings = {}
        for key, value in point.items():
            setting = algorithm_setting(key, cfg)
            if setting is None:
                point_cfg[key] = value
            else:
                settings[setting] = value
        folder = out / point_name(point)
        try:
            pairs = pair_configs(point_cfg, parser, fit_parser, folder, algorithms, seeds, jobs,
                                 settings_for(algorithms, settings), out / "round0",
                                 group=f"{name}/{point_name(point)}", threads=threads)
        except ConfigError as err:
            raise ConfigError(f"--grid point {point_name(point)}: {err}") from None
        shared = []
        for p in pairs:  # an algorithm the sweep leaves alone has the same config at every point: run it once
            config = yaml.safe_load(p.config_yaml)
            config.pop("run_dir", None)
            config.pop("wandb", None)  # its group names the point
            identity = yaml.safe_dump(config, sort_keys=True)
            if identity not in seen:
                seen[identity] = p
                unique.append(p)
            shared.append(seen[identity])
        points.append((point, folder, shared))
    uses: dict[int, int] = {}
    for _, _, shared in points:
        for p in set(map(id, shared)):
            uses[p] = uses.get(p, 0) + 1
    for p in unique:  # a pair that serves several points is the comparison's, not one point's
        if uses[id(p)] > 1:
            p.config_yaml = with_group(p.config_yaml, name)
    return GridPlan(grid, points, unique, skipped)


def run_grid(cfg: Namespace, plan: GridPlan, out: Path, algorithms: list[str], seeds: list[int], jobs: int,
             console: Console, fit_parser: ArgumentParser) -> list[PairResult]:
    """Run every distinct pair of ``plan`` once (skipping finished ones, resuming interrupted ones), then each
    point's report and the grid's; returns every point's pair results (the CLI exits 1 when any failed)."""
    todo = [p for p in plan.unique if not finished(p)]
    console.print(f"[bold]cosmos-pl compare --grid[/bold]: {grid_counts(plan, out, algorithms, seeds, jobs, todo)}")
    errors = execute(cfg, todo, jobs, out, fit_parser, console)
    config_name = Path(str((cfg.get("config") or ["compare"])[-1])).stem
    results, tables = [], []
    for point, folder, pairs in plan.points:
        folder.mkdir(parents=True, exist_ok=True)
        title = f"{config_name}, {point_name(point)}: {', '.join(dict.fromkeys(algorithms))}"
        got = report_pairs(cfg, pairs, errors, folder, algorithms, console, title, log_table=False)
        results += got
        tables.append((point, summarize(got, metric=cfg.headline_metric), point_notes(point, plan.skipped)))
    write_grid_report(plan, tables, out, config_name, cfg.headline_metric, console)
    log_comparison(cfg, out, comparison_name(cfg, out), [(point_name(point), folder) for point, folder, _ in plan.points])
    return results

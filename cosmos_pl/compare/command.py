"""``cosmos-pl compare``: read the algorithms, seeds and jobs, plan every pair (at every grid point), run them and
write the report.

:func:`run_compare` turns the config into one plan first (:func:`make_plan`: the names, the lists, every pair's
config at every point, checked before any pair starts; :mod:`cosmos_pl.compare.plan`), then locks ``--out`` and runs
the plan's pairs (:mod:`cosmos_pl.compare.pairs`, or Slurm jobs: :mod:`cosmos_pl.compare.slurm`); with ``--grid``
the pairs of every point of the grid (:mod:`cosmos_pl.compare.grid`), each distinct pair once, then each point's
report and the grid's. Only :func:`make_plan` reads the config; what runs and reports reads the plan.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Optional

import yaml
from jsonargparse import ArgumentParser, Namespace
from rich.console import Console

from cosmos_pl.algorithms import algorithm_class
from cosmos_pl.compare.grid import (
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
from cosmos_pl.compare.pairs import execute_pairs, pair_configs, report_pairs
from cosmos_pl.compare.plan import ComparePlan, Pair, Point
from cosmos_pl.compare.report import PairResult, summarize
from cosmos_pl.compare.wandb_runs import comparison_name, log_comparison, table_run, with_group
from cosmos_pl.config import CompareConfig, SlurmConfig, check_seed
from cosmos_pl.errors import ConfigError, check
from cosmos_pl.report import log_console
from cosmos_pl.runs.locks import FolderLock
from cosmos_pl.runs.run_directory import create_folder

__all__ = ["run_compare", "CompareResult", "make_plan", "run_plan", "execute"]


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
    plan = make_plan(cfg, parser, fit_parser)
    if plan.dry_run:
        todo = plan.todo()
        if plan.grid:
            print_grid_plan(plan, todo, console)
        else:
            console.print(f"dry run: {_counts(plan, todo, 'would run')}")
        return CompareResult([], plan.out)
    create_folder(plan.out, "--out")
    with FolderLock(plan.out, "--out"):  # one compare per folder: a second would delete the pairs the first runs
        return CompareResult(run_plan(plan, console), plan.out)


def make_plan(cfg: Namespace, parser: ArgumentParser, fit_parser: ArgumentParser) -> ComparePlan:
    """The comparison ``cfg`` (parsed by the ``compare`` ``parser``) as a plan: every pair's ``fit`` config,
    checked with ``fit_parser`` as ``fit`` checks it, at every point of ``--grid``; writes nothing.

    Raises:
        ConfigError: an unknown algorithm name, a bad list, a bad pair setting, a bad ``--grid`` key or value
            (naming its point), or an ``--out`` that is a file.
    """
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
    common = dict(out=out, algorithms=tuple(algorithms), seeds=tuple(seeds), jobs=jobs,
                  title=Path(str((cfg.get("config") or ["compare"])[-1])).stem, headline_metric=cfg.headline_metric,
                  table_run=table_run(cfg, out), slurm=slurm, dry_run=bool(cfg.get("dry_run")))
    if grid:  # every point's pairs checked before anything is written
        points, unique, skipped = _plan_grid(cfg, parser, fit_parser, out, algorithms, seeds, jobs, grid, threads,
                                             round0_groups=slurm is not None)
        return ComparePlan(**common, grid=tuple(grid), points=points, unique=unique, skipped=skipped)
    pairs = tuple(pair_configs(cfg, parser, fit_parser, out, algorithms, seeds, jobs, threads=threads,
                               round0_groups=slurm is not None))
    return ComparePlan(**common, grid=(), points=(Point({}, out, pairs),), unique=pairs, skipped={})


def _slurm_settings(cfg: Namespace) -> Optional[SlurmConfig]:
    """The ``slurm`` group, built and checked, with ``--launcher slurm``; None with ``--launcher local``."""
    if cfg.get("launcher", "local") != "slurm":
        return None
    return SlurmConfig(**cfg.slurm.clone().as_dict())


def _plan_grid(cfg: Namespace, parser: ArgumentParser, fit_parser: ArgumentParser, out: Path, algorithms: list[str],
               seeds: list[int], jobs: int, grid: list[tuple[str, list[Any]]], threads: Optional[int], *,
               round0_groups: bool) -> tuple[tuple[Point, ...], tuple[Pair, ...], dict[str, list[str]]]:
    """Every point's pairs, each checked as ``fit`` checks a config: the points, each distinct pair once, and per
    swept algorithm setting the algorithms that do not take it. ``threads`` and ``round0_groups``: as
    :func:`~cosmos_pl.compare.pairs.pair_configs` takes them.

    Raises:
        ConfigError: a bad key (:func:`~cosmos_pl.compare.grid.check_keys`) or a bad value at some point, naming
            it."""
    skipped = check_keys(grid, cfg, algorithms)
    name = comparison_name(cfg, out)
    points, seen, unique = [], {}, []
    for values in grid_points(grid):
        point_cfg = cfg.clone()
        settings = {}
        for key, value in values.items():
            setting = algorithm_setting(key, cfg)
            if setting is None:
                point_cfg[key] = value
            else:
                settings[setting] = value
        try:
            pairs = pair_configs(point_cfg, parser, fit_parser, out / point_name(values), algorithms, seeds, jobs,
                                 settings_for(algorithms, settings), out / "round0",
                                 group=f"{name}/{point_name(values)}", threads=threads, round0_groups=round0_groups)
        except ConfigError as err:
            raise ConfigError(f"--grid point {point_name(values)}: {err}") from None
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
        points.append((values, out / point_name(values), shared))
    uses = Counter(i for _, _, shared in points for i in set(map(id, shared)))
    # a pair that serves several points is the comparison's, not one point's: the same new object at each point
    regrouped = {id(p): replace(p, config_yaml=with_group(p.config_yaml, name), wandb_group=name)
                 for p in unique if uses[id(p)] > 1}
    final = [regrouped.get(id(p), p) for p in unique]
    return (tuple(Point(values, folder, tuple(regrouped.get(id(p), p) for p in shared))
                  for values, folder, shared in points), tuple(final), skipped)


def execute(plan: ComparePlan, todo: list[Pair], console: Console) -> dict[str, Optional[str]]:
    """Run the pairs ``todo`` where ``plan`` says: on this machine (``plan.jobs`` side by side) or as Slurm
    jobs (:mod:`cosmos_pl.compare.slurm`); returns each pair's error (None: it finished) by its key. First the
    settings compare filled in for the pairs (:attr:`~cosmos_pl.compare.plan.Pair.note`), once each."""
    for note in dict.fromkeys(p.note for p in todo if p.note):  # one unless a grid sweeps an executor setting
        console.print("\n".join(line[2:] for line in note.splitlines()), markup=False, highlight=False)
    slurm = plan.slurm
    if slurm is None:
        return execute_pairs(todo, plan.jobs, console)
    from cosmos_pl.compare.slurm import execute_slurm

    if todo:  # the count line above speaks of --jobs, which Slurm's resources replace
        console.print(f"--launcher slurm ({slurm.cluster}): each pair a job of {slurm.cpus_per_job} CPU(s) and "
                      f"{slurm.gpus_per_job} GPU(s) for up to {slurm.time_min} min, --jobs does not apply")
    return execute_slurm(todo, slurm, plan.out, console)


def run_plan(plan: ComparePlan, console: Console) -> list[PairResult]:
    """Inside the locked ``plan.out``: run every distinct pair of ``plan`` not finished yet (resuming interrupted
    ones), then the report (with ``--grid``, each point's and the grid's); returns every point's pair results (the
    CLI exits 1 when any failed)."""
    todo = plan.todo()
    if not plan.grid:
        console.print(f"[bold]cosmos-pl compare[/bold]: {_counts(plan, todo)}")
        errors = execute(plan, todo, console)
        return report_pairs(plan, list(plan.unique), errors, plan.out, console)
    console.print(f"[bold]cosmos-pl compare --grid[/bold]: {grid_counts(plan, todo)}")
    errors = execute(plan, todo, console)
    results, tables = [], []
    for point in plan.points:
        point.folder.mkdir(parents=True, exist_ok=True)
        title = f"{plan.title}, {point_name(point.values)}: {', '.join(dict.fromkeys(plan.algorithms))}"
        got = report_pairs(plan, list(point.pairs), errors, point.folder, console, title, log_table=False)
        results += got
        tables.append((point.values, summarize(got, metric=plan.headline_metric),
                       point_notes(point.values, plan.skipped)))
    write_grid_report(plan, tables, console)
    log_comparison(plan.table_run, plan.out, [(point_name(p.values), p.folder) for p in plan.points])
    return results


def _counts(plan: ComparePlan, todo: list[Pair], verb: str = "to run") -> str:
    """What a compare without a grid (or its dry run, ``verb`` "would run") is about to do, in one line."""
    pairs = plan.unique
    return (f"{len(pairs)} pairs ({', '.join(dict.fromkeys(plan.algorithms))} x seeds {list(plan.seeds)}); "
            f"{len(pairs) - len(todo)} already finished in {plan.out}, {len(todo)} {verb}, {plan.jobs} at a time")

"""The pairs of ``cosmos-pl compare``: every (algorithm, seed) pair as its own ``cosmos-pl fit`` process, and the
report of their records.

Each pair gets ``OUT/runs/<algorithm>-seed<seed>/`` with its fully resolved ``pair.yaml`` (comment lines at its
top name the settings compare filled in, :func:`fill_executor`), the run directory's files and ``log.txt``. Pairs
with the same seed share the partition (same data settings and seed) and their round 0: it is trained once and
kept in ``OUT/round0/`` (``fit --round0_cache``), giving the same numbers. A pair whose ``summary.json`` exists
under the same config is finished and skipped on a rerun; one that was interrupted resumes from its last round
checkpoint (``fit --resume``); one that finished under a different config is an error (use a new ``--out``). A
SIGTERM or Ctrl-C to compare reaches every running pair, which keeps its last complete round. Pairs run one after
another or ``jobs`` side by side, the CPU cores split between them unless ``executor.threads_per_worker`` is given
(two trainings with all threads each slow each other down many times over; :func:`fill_executor`), and the
visible GPUs too: side-by-side pairs take the GPUs in turn (:func:`gpu_slots`).
"""

from __future__ import annotations

import contextlib
import csv
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Optional

import torch
import yaml
from jsonargparse import ArgumentParser, Namespace
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from cosmos_pl.algorithms import COSMOS, algorithm_class
from cosmos_pl.class_groups import parse_args
from cosmos_pl.compare.plan import ComparePlan, Pair, finished, run_settings
from cosmos_pl.compare.report import PairResult, clustering_of, write_report
from cosmos_pl.compare.wandb_runs import comparison_name, log_comparison
from cosmos_pl.config import round0_key, validate_config
from cosmos_pl.errors import ConfigError
from cosmos_pl.execution.devices import available_cpus, physical_gpu
from cosmos_pl.files import atomic_write_text
from cosmos_pl.progress import Ticker, line_every_s, round_of
from cosmos_pl.runs import checkpoint
from cosmos_pl.runs.locks import FolderLock

__all__ = ["Pair", "fill_executor", "pair_configs", "finished", "gpu_slots", "launch", "run_logged", "failure_line",
           "execute_pairs", "report_pairs", "rounds_done", "RUNNING"]

_COMPARE_ONLY = ("algorithms", "seeds", "jobs", "out", "config", "comparison", "overwrite", "grid", "dry_run",
                 "launcher", "slurm")


def fill_executor(executor: dict[str, Any], defaults: dict[str, Any], jobs: int,
                  threads: Optional[int] = None) -> tuple[dict[str, Any], list[str]]:
    """The executor settings of every pair: the user's where given, compare's where left unset.

    A setting counts as given when its value differs from the parser's default (``defaults``: ``threads_per_worker``
    None, ``workers_per_device`` auto), on the command line or in a config file. Left unset,
    ``threads_per_worker`` becomes ``threads`` (a Slurm job's CPUs) or this machine's cores
    (:func:`~cosmos_pl.execution.devices.available_cpus`) split between the ``jobs`` pairs run side by side, at
    least 1: a pair left at None would take every core, and pairs side by side would slow each other down many
    times over. With ``jobs`` > 1 on this machine, ``workers_per_device`` left at auto becomes 1: pairs side by
    side would each size their workers from the same GPUs' free memory.

    Args:
        executor: the ``executor`` group as parsed (``kind``, ``devices``, ``workers_per_device``,
            ``threads_per_worker``).
        defaults: the same group's defaults.
        jobs: pairs run side by side (``--jobs``), >= 1.
        threads: a Slurm job's CPUs (``slurm.cpus_per_job``); None on this machine.

    Returns:
        The pairs' executor settings, and a line per setting filled in (``executor.KEY: VALUE (why; how to
        choose)``).
    """
    filled, why = dict(executor), []
    if executor.get("threads_per_worker") == defaults.get("threads_per_worker"):
        if threads is not None:
            filled["threads_per_worker"] = threads
            reason = f"the Slurm job's {threads} CPU(s), slurm.cpus_per_job"
        else:
            cpus = available_cpus()
            filled["threads_per_worker"] = max(1, cpus // jobs)
            reason = f"this machine's {cpus} CPU core(s) split between --jobs {jobs} pair(s) side by side"
        why.append(f"executor.threads_per_worker: {filled['threads_per_worker']} ({reason}; give "
                   "--executor.threads_per_worker to choose)")
    if threads is None and jobs > 1 and executor.get("workers_per_device") == defaults.get("workers_per_device"):
        filled["workers_per_device"] = 1
        why.append(f"executor.workers_per_device: 1 (--jobs {jobs} pairs side by side would each size their workers "
                   "from the same GPUs' free memory; give --executor.workers_per_device to choose)")
    return filled, why


def pair_configs(cfg: Namespace, parser: ArgumentParser, fit_parser: ArgumentParser, out: Path,
                 algorithms: list[str], seeds: list[int], jobs: int,
                 algorithm_settings: Optional[dict[str, dict[str, Any]]] = None,
                 round0: Optional[Path] = None, group: Optional[str] = None,
                 threads: Optional[int] = None, *, round0_groups: bool = False) -> list[Pair]:
    """Resolve every pair's ``fit`` config and check it as ``fit`` does (parse, build, :func:`validate_config`)
    before anything runs. ``algorithm_settings``: per name of ``algorithms``, init settings given to that algorithm
    on top of its own (a grid point's); ``round0``: the round-0 cache folder (default ``out/round0``); ``group``:
    the pairs' W&B group (default: the comparison's name, :func:`~cosmos_pl.compare.wandb_runs.comparison_name`),
    their W&B job type being the algorithm's short name; ``threads``: a Slurm job's CPUs, the torch threads of a
    pair whose ``executor.threads_per_worker`` the user left unset (None: this machine's cores split between
    ``jobs``). The executor settings the user gave are kept; those compare fills in are named at the top of
    ``pair.yaml`` (:attr:`~cosmos_pl.compare.plan.Pair.note`, :func:`fill_executor`). With ``round0_groups``
    (``--launcher slurm``) each pair's :attr:`~cosmos_pl.compare.plan.Pair.round0_group` is its
    :func:`~cosmos_pl.config.round0_key`, read from the config checked here."""
    base = yaml.safe_load(parser.dump(cfg, skip_unset=False))
    for key in _COMPARE_ONLY:
        base.pop(key, None)
    settings = {algorithm_class(k, "comparison.settings").name: v for k, v in (cfg.comparison.settings or {}).items()}
    defaults = {k: parser.get_default(f"executor.{k}") for k in ("threads_per_worker", "workers_per_device")}
    executor, why = fill_executor(base["executor"], defaults, jobs, threads)
    note = "".join(f"# {line}\n" for line in ["cosmos-pl compare filled in these settings, which were left unset:",
                                               *(f"  {w}" for w in why)]) if why else ""
    group = group or comparison_name(cfg, out)
    pairs = []
    for name in algorithms:
        cls = algorithm_class(name)
        if name in settings:
            init_args = settings[name]
        elif cls is COSMOS and str(base["algorithm"]["class_path"]).endswith(".COSMOS"):
            init_args = base["algorithm"].get("init_args", {})
        else:
            init_args = {}
        init_args = {**init_args, **(algorithm_settings or {}).get(name, {})}
        for seed in seeds:
            run_dir = out / "runs" / f"{cls.name}-seed{seed}"
            pair_cfg = {**base, "seed": seed, "run_dir": str(run_dir), "round0_cache": str(round0 or out / "round0"),
                        "algorithm": {"class_path": f"{cls.__module__}.{cls.__name__}", "init_args": init_args},
                        "executor": executor,
                        "wandb": {**base["wandb"], "group": group, "job_type": cls.name}}
            text = yaml.safe_dump(pair_cfg, sort_keys=False)
            # parse, build and check every setting now: a bad one fails here, before any pair trains
            try:
                checked = parse_args(fit_parser, ["--config", text])  # each algorithm from its own defaults
            except ConfigError as err:
                if name not in settings:
                    raise
                raise ConfigError(f"comparison.settings.{name}: {err}") from None
            validate_config(fit_parser.instantiate(checked))
            key = round0_key(checked, int(checked.executor.threads_per_worker)) if round0_groups else None
            pairs.append(Pair(cls.name, seed, run_dir, fit_parser.dump(checked, skip_unset=False), note, key, group))
    return pairs


def rounds_done(pair: Pair) -> int:
    try:
        with open(pair.run_dir / "metrics.csv") as f:
            return sum(1 for _ in csv.DictReader(f))
    except OSError:
        return 0


def _resumable(pair: Pair) -> bool:
    """An interrupted earlier attempt of this very pair that left a round checkpoint."""
    saved = pair.run_dir / "pair.yaml"
    return (saved.is_file() and (pair.run_dir / "config.yaml").is_file()
            and checkpoint.latest_round(pair.run_dir) is not None
            and run_settings(saved.read_text()) == run_settings(pair.config_yaml))


# the pairs' processes now running, so that a SIGTERM/SIGINT to compare reaches them (they save and exit)
RUNNING: set[subprocess.Popen] = set()


def gpu_slots(jobs: int, n_gpu: int) -> list[Optional[str]]:
    """``CUDA_VISIBLE_DEVICES`` for each of ``jobs`` pairs run side by side over ``n_gpu`` visible GPUs (entries
    of this process's own ``CUDA_VISIBLE_DEVICES`` when it is set): with no more jobs than GPUs, slot ``k`` gets
    GPUs ``k, k + jobs, ...``; with more, GPU ``k mod n_gpu`` (pairs then share a GPU). ``None`` (the pair sees
    what compare sees) for one job at a time or without GPUs."""
    if jobs <= 1 or n_gpu == 0:
        return [None] * jobs
    if jobs <= n_gpu:
        return [",".join(physical_gpu(g) for g in range(k, n_gpu, jobs)) for k in range(jobs)]
    return [physical_gpu(k % n_gpu) for k in range(jobs)]


def launch(pair: Pair, gpus: Optional[str] = None, ignore: tuple[int, ...] = ()) -> Optional[str]:
    """Run one pair in its own process (on the GPUs ``gpus``, a ``CUDA_VISIBLE_DEVICES`` value, when given),
    resuming an interrupted attempt from its last complete round (``fit --resume``); returns None on success, else
    a one-line reason. The process ignores the signals ``ignore`` (a Slurm job's pre-emption signal, which the job
    itself answers: :mod:`cosmos_pl.compare.slurm`)."""
    if _resumable(pair):
        cmd = [sys.executable, "-m", "cosmos_pl.cli", "fit", "--resume", str(pair.run_dir)]
        mode = "a"
    else:
        if pair.run_dir.exists():  # an unfinished attempt without a checkpoint: start clean, never mix runs
            with FolderLock(pair.run_dir, "--out"):  # unless a pair left running by an earlier compare holds it
                shutil.rmtree(pair.run_dir)
        pair.run_dir.mkdir(parents=True)
        atomic_write_text(pair.run_dir / "pair.yaml", pair.note + pair.config_yaml)
        cmd = [sys.executable, "-m", "cosmos_pl.cli", "fit", "--config", str(pair.run_dir / "pair.yaml")]
        mode = "w"
    status = run_logged(cmd, pair.run_dir / "log.txt", mode, gpus, ignore)
    if status == 0 and (pair.run_dir / "summary.json").is_file():
        return None
    return failure_line(status, pair.run_dir / "log.txt")


def run_logged(cmd: list[str], log: Path, mode: str, gpus: Optional[str] = None, ignore: tuple[int, ...] = ()) -> int:
    """Run ``cmd`` (a ``cosmos-pl fit``) to its end with its output in ``log`` (opened with ``mode``), on the GPUs
    ``gpus`` when given, ignoring the signals ``ignore``, kept in :data:`RUNNING` while it runs (a stop request
    reaches it); returns its exit status."""
    env = {**os.environ, "PYTHONHASHSEED": "0", "COLUMNS": "120"}
    if gpus is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpus
    with open(log, mode) as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env,
                                preexec_fn=(lambda: [signal.signal(s, signal.SIG_IGN) for s in ignore]) if ignore
                                else None)
        RUNNING.add(proc)
        try:
            return proc.wait()
        finally:
            RUNNING.discard(proc)


# a fit's one-line errors (a data error naming up to five files, in full) fit whole
FAILURE_CHARS = 1000


def failure_line(status: int, log: Path) -> str:
    """Why a ``fit`` process failed, in one line: its exit status, its log's last line (at most
    :data:`FAILURE_CHARS` characters, shortened between words) and the log's path."""
    tail = log.read_text(errors="replace").strip().splitlines()[-1:] or [""]
    reason = textwrap.shorten(tail[0], FAILURE_CHARS, placeholder=" ...")
    return f"exit status {status}: {reason} (log: {log})"


def _result(pair: Pair, error: Optional[str]) -> PairResult:
    if error is not None:
        return PairResult(pair.algorithm, pair.seed, error=error)
    summary = json.loads((pair.run_dir / "summary.json").read_text())
    with open(pair.run_dir / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    rounds = [float(r["personalized_acc_mean"]) for r in rows]
    top5 = [float(r["personalized_top5_mean"]) for r in rows if r.get("personalized_top5_mean")]
    val = [float(r["personalized_val_acc_mean"]) for r in rows if r.get("personalized_val_acc_mean")]
    return PairResult(pair.algorithm, pair.seed, rounds, summary["scored_model"], summary["communication"],
                      rounds_top5=top5 if len(top5) == len(rounds) else [],
                      rounds_val=val if len(val) == len(rounds) else [],
                      clusters=clustering_of(summary))


def report_pairs(plan: ComparePlan, pairs: list[Pair], errors: dict[str, Optional[str]], out: Path,
                 console: Console, title: Optional[str] = None, *, log_table: bool = True) -> list[PairResult]:
    """Read every pair's records and write the report of ``plan``'s comparison into ``out`` (``title``: the
    report's, default ``<config name>: <algorithms>``); returns the pairs' results. With ``log_table`` (a
    comparison, not one point of a grid) the table also goes to W&B in a run of its own
    (:func:`~cosmos_pl.compare.wandb_runs.log_comparison`; not with ``--wandb.mode disabled``)."""
    results = [_result(p, errors.get(p.key)) for p in pairs]
    for r in results:
        if r.error:
            console.print(f"[red]{r.algorithm} seed {r.seed} failed[/red]: {r.error}")
    title = title or f"{plan.title}: {', '.join(dict.fromkeys(plan.algorithms))}"
    write_report(results, out, title, plan.headline_metric)
    if log_table:
        log_comparison(plan.table_run, out)
    console.print((out / "comparison.md").read_text(), markup=False, highlight=False, soft_wrap=True)
    console.print(f"report: {out / 'comparison.md'}, {out / 'communication.md'}, {out / 'accuracy_vs_round.png'}")
    return results


def execute_pairs(todo: list[Pair], jobs: int, console: Console) -> dict[str, Optional[str]]:
    """Run the pairs ``todo``, ``jobs`` side by side; returns each pair's error (None: it finished), by
    :attr:`~cosmos_pl.compare.plan.Pair.key`.

    On a terminal a bar per pair shows its round; without one, a line when a pair starts and ends and, every
    :func:`~cosmos_pl.progress.line_every_s` seconds, one line with the running pairs' rounds (each as the run
    counts them, ``round 1/2``: :func:`~cosmos_pl.progress.round_of`)."""
    errors: dict[str, Optional[str]] = {}
    if not todo:
        return errors
    rounds = {p.key: int(yaml.safe_load(p.config_yaml)["rounds"]) for p in todo}  # a grid may sweep them
    running: dict[str, Pair] = {}

    def rounds_line() -> None:  # without a terminal: where the running pairs are
        now = dict(running)
        if now:
            console.print("running: " + "; ".join(f"{p.label} {round_of(rounds_done(p), rounds[p.key])}"
                                                  for p in now.values()), markup=False, highlight=False)

    bar = Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[round]}"),
                   TimeElapsedColumn(), console=console) if console.is_terminal else None

    def show(p: Pair, **kwargs: Any) -> None:  # the bar counts recorded rounds (round 0 too), the text the round
        done = rounds_done(p)
        bar.update(tasks[p.key], completed=done, round=round_of(done, rounds[p.key]), **kwargs)

    with bar or contextlib.nullcontext(), Ticker(line_every_s(), rounds_line) if bar is None \
            else contextlib.nullcontext():
        tasks = {p.key: bar.add_task(p.label, total=rounds[p.key] + 1, start=False, round=round_of(0, rounds[p.key]))
                 for p in todo} if bar else {}
        stop = threading.Event()

        def watch() -> None:  # show which pair and round is running
            while not stop.wait(2.0):
                for p in todo:
                    show(p)

        free: queue.SimpleQueue = queue.SimpleQueue()  # the side-by-side slots, each with its GPUs
        for slot in gpu_slots(min(jobs, max(1, len(todo))), torch.cuda.device_count()):  # no GPU left idle
            free.put(slot)

        def one(p: Pair) -> None:
            if bar:
                bar.start_task(tasks[p.key])
            gpus = free.get()
            console.print(f"started {p.label} -> {p.run_dir}" + (f" on GPU {gpus}" if gpus is not None else ""))
            running[p.key] = p
            started = time.perf_counter()
            try:
                errors[p.key] = launch(p, gpus)
            finally:
                free.put(gpus)
                running.pop(p.key, None)
            state = "failed" if errors[p.key] else "done"
            line = f"{p.label} ({state}, {time.perf_counter() - started:.0f} s)"
            if bar:
                show(p, description=line)
            console.print(line)

        watcher = threading.Thread(target=watch, daemon=True)
        if bar:
            watcher.start()
        pool = ThreadPoolExecutor(max_workers=jobs)
        futures = [pool.submit(one, p) for p in todo]
        try:
            for fut in futures:
                fut.result()
        except BaseException:  # SIGTERM/SIGINT (signals.Interrupted): the pairs keep their last round and stop too
            for proc in list(RUNNING):
                proc.send_signal(signal.SIGTERM)
            pool.shutdown(wait=True, cancel_futures=True)
            raise
        finally:
            stop.set()
        pool.shutdown(wait=True)
    return errors

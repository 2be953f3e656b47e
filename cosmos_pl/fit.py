"""``cosmos-pl fit``: one run of one algorithm from its parsed settings, into its run directory.

:func:`run_fit` locks the run directory, checks every setting before any data is loaded, and runs the rounds
(:class:`~cosmos_pl.federated.runner.Runner`), in-process or over another transport (the Flower ServerApp passes
its clients); it writes config.yaml, partition.json, the records and the final line. :func:`resume_config` is the
config a ``fit --resume RUN_DIR`` continues with (the run's own config.yaml); :func:`resume_line` what a stopped run
says about resuming. The round-0 cache's key is :func:`cosmos_pl.config.round0_key`.
"""

from __future__ import annotations

import functools
import time
from pathlib import Path
from typing import Any, Callable, Optional

from jsonargparse import ArgumentParser, Namespace

from cosmos_pl.algorithms import Algorithm
from cosmos_pl.config import DataConfig, gpus_in_use, round0_key, validate_against_data, validate_config
from cosmos_pl.errors import ConfigError, UserError
from cosmos_pl.execution.devices import available_cpus, too_many_threads
from cosmos_pl.signals import Interrupted
from cosmos_pl.training.cuda_check import describe_device, device_line

__all__ = ["run_fit", "final_line", "resume_config", "resume_line"]


def _default_run_dir(cfg: Namespace) -> Path:
    """runs/<config name>-<YYYYmmdd-HHMMSS>; RunDirectory.unique adds -2, -3, ... when it is taken."""
    configs = cfg.get("config") or []
    name = Path(str(configs[-1])).stem if configs else "default"
    return Path("runs") / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"


def run_fit(cfg: Namespace, parser: ArgumentParser, transport: Optional[Callable[..., Any]] = None,
            server: Any = None) -> dict[str, Any]:
    """Run one experiment from a parsed ``fit`` namespace; returns the summary dict.

    ``transport``: ``(view, config_yaml=..., num_clients=...) -> Clients``, the clients over another transport
    than in-process (:mod:`cosmos_pl.flower`'s ServerApp passes its Flower clients), given the resolved config and
    N; the round loop, records and everything else are shared. ``server``: with a transport, the server's data
    (:class:`~cosmos_pl.federated.server_data.ServerData`: U and the class list) when the clients' data are their
    own (a deployment): no data set is loaded here; without it the configured data set is loaded for U (and, in a
    simulation, the clients').

    The run directory is locked for the whole run (:class:`~cosmos_pl.runs.locks.FolderLock`): a second
    process on it is refused, naming the first. A run that fails before its training begins (the data, a backbone
    that cannot take the images, W&B, a signal) removes the files it wrote there (config.yaml, ...), so the same
    command can be run again in the same folder; from round 0 on they are the run's records and stay.
    """
    from cosmos_pl.runs import checkpoint
    from cosmos_pl.runs.run_directory import RunDirectory

    saved = cfg.clone()
    saved.overwrite = False  # config.yaml describes the run; rerunning it must not clear a folder unasked
    saved.resume = None
    config_yaml = parser.dump(saved, skip_unset=False)
    where = saved.clone()
    where.run_dir = None  # the hash names the settings, not the folder (a run directory may be moved)
    settings_hash = checkpoint.config_hash(parser.dump(where, skip_unset=False))
    # every user error is found here, before any data is loaded: settings, the run directory (locked, writable),
    # the checkpoint to resume from, W&B
    init = parser.instantiate(cfg)
    validate_config(init)
    resume, resume_path = None, None
    if cfg.resume:
        run_dir = RunDirectory.resume(cfg.resume)  # locked first: another process may be resuming the same run
        try:
            resume, resume_path = checkpoint.load_latest(Path(cfg.resume))
            if resume.get("config_hash") != settings_hash:
                raise ConfigError(f"--resume={cfg.resume!r}: config.yaml no longer matches the one its checkpoint "
                                  f"{resume_path.name} was made with (edited, or another cosmos-pl version); restore "
                                  "it, or start a new run")
        except BaseException:
            run_dir.release()
            raise
    else:
        run_dir = RunDirectory.prepare(cfg.run_dir, overwrite=cfg.overwrite) if cfg.run_dir else \
            RunDirectory.unique(_default_run_dir(cfg))
    try:
        return _fit_in(run_dir, cfg, init, config_yaml, settings_hash, resume, resume_path, transport, server)
    except BaseException:
        if not run_dir.training:  # a failed start (data, backbones, W&B, ...): rerunning in the same folder must work
            run_dir.remove_failed_start()
        raise
    finally:
        run_dir.release()


def _fit_in(run_dir: Any, cfg: Namespace, init: Namespace, config_yaml: str, settings_hash: str,
            resume: Optional[dict[str, Any]], resume_path: Optional[Path],
            transport: Optional[Callable[..., Any]], server: Any = None) -> dict[str, Any]:
    """:func:`run_fit` inside its locked run directory: tracker, data, runner, records, the final line."""
    from lightning.fabric.utilities.seed import seed_everything

    from cosmos_pl.runs import checkpoint
    from cosmos_pl.runs.recorder import Recorder
    from cosmos_pl.federated.runner import Runner, RunSettings, ServerData
    from cosmos_pl.report import log_console, plot_run, print_table
    from cosmos_pl.tracking import Tracker

    console = log_console()  # without a terminal: whole lines, not wrapped at 80 columns
    algorithm: Algorithm = init.algorithm
    run_path = run_dir.path
    device = _device(init)
    # the first line: what the stages run on (one line, however long: soft_wrap)
    console.print(device_line(device), markup=False, highlight=False, soft_wrap=True)
    if device.get("precision_note"):  # bf16-mixed on a GPU without native bfloat16: trainer.precision_fallback
        console.print(device["precision_note"], markup=False, highlight=False, soft_wrap=True)
    threads = too_many_threads(init.executor.threads_per_worker, available_cpus())
    if threads:
        console.print(threads, markup=False, highlight=False, soft_wrap=True)
    tracker = Tracker(init.wandb.mode, run_path, _plain(cfg), init.wandb.project, init.wandb.entity, init.wandb.name,
                      init.wandb.tags, run_id=None if resume is None else resume.get("wandb_run_id"),
                      group=init.wandb.group, job_type=init.wandb.job_type)
    try:
        seed_everything(init.seed, verbose=False)
        data_cfg: DataConfig = init.data
        if server is None:
            data, federation = data_cfg.build(init.seed)
            name = data.name
            # over another transport the server keeps U and the class list only: the clients' data stay theirs
            server = federation if transport is None else ServerData(federation.public, list(federation.classes))
        else:  # a deployment: the sites hold their own data
            name = f"{data_cfg.num_clients} sites' own data"
        validate_against_data(init, len(server.classes))
        # written once the data is in: a run that failed to load its data leaves no result files behind
        if resume is None:
            run_dir.write_text("config.yaml", config_yaml)
        console.print(f"[bold]cosmos-pl[/bold] {algorithm.name} on {name}: {data_cfg.num_clients} clients, "
                      f"|U| = {len(server.public)}, M = {len(server.classes)}; run directory {run_path}")
        settings = RunSettings(
            rounds=init.rounds, seed=init.seed, clients_per_round=init.get("clients_per_round"),
            evaluate_every=init.evaluate_every, headline_metric=init.headline_metric,
            transformations=init.transformations, trainer=init.trainer, executor=init.executor,
            communication=init.communication, failures=init.failures, checkpoints=init.checkpoint)
        runner = Runner(
            server, algorithm, init.clients, settings, recorder=Recorder(run_dir, tracker), console=console,
            checkpoint_meta={"config_hash": settings_hash, "wandb_run_id": tracker.run_id}, device=device,
            transport=None if transport is None else functools.partial(
                transport, config_yaml=config_yaml, num_clients=init.data.num_clients))
        infos, facts = runner.clients.infos, runner.clients.simulation()
        run_dir.write_json("partition.json", {  # what the clients reported, and a simulation's partition
            "dataset": name, "num_classes": len(server.classes), "classes": list(server.classes),
            "public_set_size": len(server.public), "test_set_sizes": [c.test_size for c in infos],
            "validation_set_sizes": [c.validation_size for c in infos], **(facts.partition if facts else {})})
        runner.last_checkpoint = resume_path
        run_dir.training = True  # every check passed: from here the folder's files are the run's records
        try:
            cache = Path(cfg.round0_cache) if cfg.round0_cache else None
            if cfg.get("round0_only"):
                runner.pretrain_only(cache, round0_key(cfg, runner.executor.threads))
                console.print(f"round 0 trained into {cache}")
                return {}
            summary = runner.run(cache, round0_key(cfg, runner.executor.threads), resume)
        except Interrupted as err:
            err.run_dir, err.last_round = run_path, checkpoint.latest_round(run_path)
            raise
        except UserError as err:  # failing clients or a full disk stopped it: the last complete round is kept
            done = checkpoint.latest_round(run_path)
            if done is None or transport is not None:  # a Flower run is not resumed (its models are on the nodes)
                raise
            raise type(err)(f"{err}; {resume_line(run_path, done, 'once fixed')}") from None
    finally:
        tracker.finish()
    print_table(runner.recorder.rows, console, title=f"{algorithm.name}: personalized accuracy per round")
    plot_run(runner.recorder.rows, run_path / "accuracy_vs_round.png",
             f"{algorithm.name} on {name}, seed {init.seed}: accuracy per round")
    console.print(final_line(summary, algorithm.scored) + f"; {summary['wall_seconds']:.0f} s. Files in {run_path}")
    return summary


def _device(init: Namespace) -> dict[str, Any]:
    """What this run's stages train on (:func:`~cosmos_pl.training.cuda_check.describe_device`): the GPUs in use
    (:func:`~cosmos_pl.config.gpus_in_use`), or the CPU with the cores this process may use; the precision and
    the determinism flags; for the run's first line and summary.json. Where a GPU in use has no native bfloat16
    and ``trainer.precision_fallback`` is set, ``init.trainer.precision`` becomes the fallback, which every stage
    then runs in (``precision_note`` says so)."""
    from cosmos_pl.execution.devices import available_cpus, physical_gpu
    from cosmos_pl.training.config import autotuning

    trainer = init.trainer
    gpus = gpus_in_use(init.executor, trainer.accelerator)  # none where the stages run on the CPU
    tuned = autotuning(trainer.benchmark, trainer.deterministic, "cuda" if gpus else "cpu")
    info = describe_device(trainer.accelerator, trainer.precision, [(g, physical_gpu(g)) for g in gpus],
                           available_cpus(), precision_fallback=trainer.precision_fallback,
                           deterministic=trainer.deterministic, benchmark=tuned)
    if info.get("precision_note"):
        trainer.precision = info["precision"]
    return info


def final_line(summary: dict[str, Any], scored: str) -> str:
    """``fit``'s last line: the headline metric of the scored model (mean ± SEM over clients), the other metric
    beside it where recorded, the other model, local-only (round 0), and K with the ARI where there are clusters."""
    final, local = summary["final"], summary["local_only"]
    metric = summary.get("headline_metric", "top1")
    keys = {"top1": ("personalized_acc", "acc"), "top5": ("personalized_top5", "top5")}
    other = "top5" if metric == "top1" else "top1"
    head, suffix = keys[metric]
    label = "top-5 " if metric == "top5" else ""
    parts = [f"final round {final['round']}: {summary['scored_model']} {label}"
             f"{final[head]['mean']:.4f} ± {final[head]['sem']:.4f}"]
    if keys[other][0] in final:
        o = final[keys[other][0]]
        parts[0] += f" ({'top-1' if other == 'top1' else 'top-5'} {o['mean']:.4f} ± {o['sem']:.4f})"
    teacher = final.get(f"teacher_{suffix}", {}).get("mean")
    if teacher is not None and scored != "teacher":
        parts.append(f"teacher {label}{teacher:.4f}")
    if scored == "teacher":
        parts.append(f"client f_i {label}{final[f'client_{suffix}']['mean']:.4f}")
    shifted = final.get("teacher_prior_acc", {}).get("mean") if metric == "top1" else None
    if shifted is not None:
        parts.append(f"teacher at each client's label prior {shifted:.4f}")
    parts.append(f"local-only (round 0) {label}{local[f'client_{suffix}']['mean']:.4f}")
    if summary["clusters"]["K"] is not None:
        ari = summary["clusters"]["adjusted_rand_index"]  # None without true groups (a deployment)
        parts.append(f"K = {summary['clusters']['K']}, ARI = {'n/a' if ari is None else f'{ari:.4f}'}")
    return "; ".join(parts)


_NOT_CONFIG = ("config", "resume", "run_dir", "overwrite", "__path__")


def _flat(ns: Namespace) -> dict[str, Any]:
    return _plain(ns, _NOT_CONFIG)


def _dotted(d: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(d, dict) and d:
        out = {}
        for k, v in d.items():
            out.update(_dotted(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: d}


def resume_config(cfg: Namespace, parser: ArgumentParser) -> Namespace:
    """The config to resume ``cfg.resume`` with: the run's own config.yaml. Flags given beside ``--resume`` (those
    that differ from the defaults) must agree with it.

    Raises:
        ConfigError: no config.yaml in the folder, or given settings that differ from the run's (naming the keys).
    """
    run_dir = Path(cfg.resume)
    path = run_dir / "config.yaml"
    if not run_dir.is_dir():
        raise ConfigError(f"--resume={str(run_dir)!r}: {'is a file' if run_dir.exists() else 'does not exist'}; give "
                          "the run directory of an earlier `cosmos-pl fit` (it holds config.yaml and checkpoints/)")
    # a resumed run stays in its own folder: another --run_dir or --overwrite would be silently ignored
    if cfg.run_dir is not None and Path(cfg.run_dir).resolve() != run_dir.resolve():
        raise ConfigError(f"--run_dir={cfg.run_dir!r} with --resume={str(run_dir)!r}: a run resumes in its own "
                          "folder; drop --run_dir (copy the folder first to keep the interrupted state)")
    if cfg.overwrite:
        raise ConfigError(f"--overwrite=true with --resume={str(run_dir)!r}: resuming keeps the run's files; drop "
                          "--overwrite, or start a new run without --resume")
    if not path.is_file():
        raise ConfigError(f"--resume={str(run_dir)!r}: no config.yaml there; give the run directory of an earlier "
                          "`cosmos-pl fit` (it holds config.yaml and checkpoints/)")
    saved = parser.parse_path(str(path))
    given, defaults, run = _dotted(_flat(cfg)), _dotted(_flat(parser.get_defaults())), _dotted(_flat(saved))
    differ = sorted(k for k, v in given.items() if v != defaults.get(k) and v != run.get(k))
    if differ:
        shown = ", ".join(f"{k} (run: {run.get(k)!r}, given: {given[k]!r})" for k in differ[:6])
        raise ConfigError(f"--resume={str(run_dir)!r}: the run was made with another config; these settings differ: "
                          f"{shown}; resume without them, or start a new run with --run_dir")
    saved.resume, saved.run_dir, saved.overwrite = str(run_dir), str(run_dir), False
    return saved


def _plain(cfg: Namespace, leave_out: tuple[str, ...] = ("config", "comparison", "overwrite")) -> dict[str, Any]:
    """The settings as a plain dict, without the top-level keys ``leave_out``."""
    return {k: v for k, v in cfg.clone().as_dict().items() if k not in leave_out}


def resume_line(run_dir: Path, done: int, when: str = "") -> str:
    """``rounds 0..done are saved in RUN_DIR/checkpoints: resume with `cosmos-pl fit --resume RUN_DIR```: what a
    stopped run says (a signal, failing clients, a full disk)."""
    return (f"rounds 0..{done} are saved in {run_dir}/checkpoints: resume{' ' + when if when else ''} with "
            f"`cosmos-pl fit --resume {run_dir}`")

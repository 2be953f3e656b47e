"""The ``cosmos-pl`` command line, built with jsonargparse.

``cosmos-pl fit --config FILE [--dotted.overrides]`` trains one algorithm (COSMOS by default) and writes a run
directory; ``cosmos-pl compare --config FILE --algorithms cosmos,fedmd --seeds 0,1,2 --out DIR`` runs every
(algorithm, seed) pair and writes the comparison. ``--print_config`` prints the fully resolved config; ``--help``
documents every option (from the docstrings in :mod:`cosmos_pl.config` and the algorithm classes).

``cosmos-pl fit --resume RUN_DIR`` continues a run from its last complete round checkpoint with that run's own
config, exactly as if it had never stopped (a flag that changes the config is an error naming the keys).

Exit status: 0 on success; 2 for a user error (a bad setting, missing data, a run directory in use, W&B that
cannot start, a run stopped by failing clients), printed as one line ``cosmos-pl: error: ...``; 1 for an
internal fault (a traceback and where to report it) or a failed compare pair; 143 on SIGTERM and 130 on SIGINT
(Ctrl-C), after one line saying how to resume.
"""

from __future__ import annotations

import functools
import os
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Literal, Optional, Union

from jsonargparse import ActionConfigFile, ArgumentParser, Namespace, lazy_instance

from cosmos_pl import signals
from cosmos_pl.algorithms import COSMOS, Algorithm
from cosmos_pl.class_groups import class_args
from cosmos_pl.config import (
    ClientConfig,
    CommunicationConfig,
    CompareConfig,
    DataConfig,
    ExecutorConfig,
    TrainerConfig,
    Transformations,
    WandbConfig,
    validate_against_data,
    validate_config,
)
from cosmos_pl.errors import ConfigError, UserError
from cosmos_pl.federated.checkpoint import CheckpointConfig
from cosmos_pl.federated.failures import FailureConfig
from cosmos_pl.signals import Interrupted

ISSUES_URL = "https://github.com/cosmos-pl/cosmos-pl/issues"

__all__ = ["build_parser", "build_fit_parser", "main", "run", "run_fit"]


def build_fit_parser() -> ArgumentParser:
    # parse errors are raised (ArgumentError) and printed by main as one line
    # no abbreviations: a mistyped key (--data.num_client) must be an error, not a match for another key
    p = ArgumentParser(description="Train one federated algorithm (COSMOS by default) on heterogeneous clients.",
                       exit_on_error=False, allow_abbrev=False)
    p.add_argument("--config", action=ActionConfigFile, help="YAML config file (configs/*.yaml); later flags override it.")
    p.add_argument("--seed", type=int, default=0, help="One seed for Python, NumPy, torch, the partition and every stage.")
    p.add_argument("--run_dir", type=Optional[str], default=None,
                   help="Run directory (default: a new runs/<config name>-<YYYYmmdd-HHMMSS>[-N]). One that holds "
                        "another run's files is refused unless --overwrite true.")
    p.add_argument("--overwrite", type=bool, default=False,
                   help="Reuse a --run_dir that holds another run's files: they are removed first.")
    p.add_argument("--resume", type=Optional[str], default=None,
                   help="Continue the run in this run directory from its last complete round checkpoint, with its "
                        "own config.yaml (other flags must not change it).")
    p.add_argument("--round0_cache", type=Optional[str], default=None,
                   help="Folder keeping trained round-0 client models by a hash of the settings that decide them; "
                        "runs with the same hash load them instead of training (cosmos-pl compare sets it).")
    p.add_argument("--rounds", type=int, default=3,
                   help="R: communication rounds after round 0 (COSMOS: round 1 is the PTC phase, rounds 2.. IFFT).")
    p.add_argument("--clients_per_round", type=Optional[Union[int, float]], default=None,
                   help="Clients taking part in each round after round 0: a count (e.g. 10), a fraction of "
                        "data.num_clients (e.g. 0.5), or null (every client); drawn from (seed, round). An unsampled "
                        "client neither trains nor uploads and keeps its model; every client is scored.")
    p.add_argument("--evaluate_every", type=Union[int, Literal["final"]], default=1,
                   help="Score the clients every this many rounds, or 'final': the final round only (round 0, the "
                        "local-only baseline, and the final round are always scored).")
    p.add_argument("--headline_metric", type=Literal["top1", "top5"], default="top1",
                   help="The accuracy the headline, the best round and the comparison are judged by: top1, or top5 "
                        "(the paper's for Tiny ImageNet; needs M >= 20 classes); the other is reported beside it.")
    p.add_class_arguments(DataConfig, "data")
    p.add_class_arguments(ClientConfig, "clients")
    p.add_subclass_arguments(Algorithm, "algorithm", default=lazy_instance(COSMOS), required=False,
                             help="The federated algorithm: cosmos_pl.algorithms.COSMOS (default), LocalOnly, FedMD, "
                                  "FedCT, COMET or FedAvg, with its init_args.")
    p.add_class_arguments(Transformations, "transformations")
    p.add_class_arguments(CommunicationConfig, "communication")
    p.add_class_arguments(TrainerConfig, "trainer")
    p.add_class_arguments(ExecutorConfig, "executor")
    p.add_class_arguments(FailureConfig, "failures")
    p.add_class_arguments(CheckpointConfig, "checkpoint")
    p.add_class_arguments(WandbConfig, "wandb")
    p.add_class_arguments(CompareConfig, "comparison")
    return p


def build_compare_parser() -> ArgumentParser:
    p = build_fit_parser()
    p.description = "Run every (algorithm, seed) pair on the same partition per seed and write the comparison."
    p.add_argument("--algorithms", type=Optional[str], default=None,
                   help="Comma-separated short names (cosmos, local, fedmd, fedct, comet, fedavg, ditto, fedbabu); "
                        "overrides comparison.algorithms.")
    p.add_argument("--seeds", type=Optional[str], default=None, help="Comma-separated seeds; overrides comparison.seeds.")
    p.add_argument("--jobs", type=Optional[int], default=None, help="Pairs run side by side; overrides comparison.jobs.")
    p.add_argument("--out", type=str, required=True, help="Output folder: one run directory per pair, and the report.")
    p.add_argument("--grid", action="append", type=str, default=None,
                   help="KEY=V1,V2,...: the comparison at each value (repeat for a product grid); KEY is any fit "
                        "setting (data.partitioner.init_args.alpha) or an algorithm's (algorithm.init_args.lambda_, "
                        "or lambda_, b0, temperature, aggregation): each point gets OUT/<name>=<value>/ with its "
                        "report, then OUT/grid.md and OUT/grid_<name>.png.")
    p.add_argument("--dry_run", type=bool, default=False,
                   help="Check every pair's config as a run would, print what would run (with --grid: per point), and "
                        "exit 0; runs nothing and writes nothing under --out.")
    return p


_FLOWER_RUN = ("Submit a Flower run with flwr run's arguments ([APP] [SUPERLINK] --run-config ... --stream), wait for "
               "it, and exit 0 only when it completed (2 when it failed, was stopped or could not start).")


def build_export_parser() -> ArgumentParser:
    p = build_fit_parser()
    p.description = ("Write the federation a `fit` config makes (its data set, partition, U and test sets; the seed) "
                     "as folders: OUT/client_<i>/data.npz per client, OUT/public.npz for U and the class list. Give "
                     "each site only its own folder (flower-supernode --node-config \"partition-id=<i> "
                     "data='OUT/client_<i>'\"); `fit --data.dataset cosmos_pl.data.SiteFolders "
                     "--data.dataset.root OUT` simulates the same federation from the folders.")
    p.add_argument("--out", type=str, required=True, help="Folder to write the sites into (must be empty or new).")
    return p


def run_export(cfg: Namespace) -> list[Path]:
    """``cosmos-pl export-partition``: build the federation without a validation split (each partition whole:
    every site carves its own, seeded from (seed, client)) and write it (:func:`cosmos_pl.data.export_federation`).

    Raises:
        ConfigError: ``--out`` is a file or a folder with files in it.
    """
    import dataclasses

    from cosmos_pl.data import export_federation

    out = Path(cfg.out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"--out={cfg.out!r}: {'is a file' if out.is_file() else 'is not empty'}; give a new or "
                          "empty folder")
    init = build_export_parser().instantiate(cfg)
    validate_config(init)
    _, federation = dataclasses.replace(init.data, validation_fraction=0.0).build(init.seed)
    folders = export_federation(federation, out)
    print(f"cosmos-pl: {len(folders)} site folders in {out} (client_0 .. client_{len(folders) - 1}), U "
          f"({len(federation.public_x)} images) and the class list in {out / 'public.npz'}")
    return folders


@functools.lru_cache(maxsize=1)
def build_parser() -> ArgumentParser:
    """The ``cosmos-pl`` parser with its subcommands; built once per process (parsing does not change it)."""
    parser = ArgumentParser(prog="cosmos-pl", description="cosmos-pl: model-agnostic personalized federated learning.",
                            exit_on_error=False, allow_abbrev=False)
    parser.add_argument("--version", action="version", version=_version(), help="Print the version and exit.")
    sub = parser.add_subcommands(required=True)
    sub.add_subcommand("fit", build_fit_parser(), help="Train one algorithm and write a run directory.")
    sub.add_subcommand("compare", build_compare_parser(), help="Compare algorithms over seeds and write a report.")
    sub.add_subcommand("export-partition", build_export_parser(),
                       help="Write each simulated client's data (and U) as one folder per site, for a deployment.")
    # listed for --help only: main() hands their arguments to cosmos_pl.flower.run / .keys before any parsing
    sub.add_subcommand("flower-run", ArgumentParser(description=_FLOWER_RUN),
                       help="flwr run that waits for the run and exits 2 unless it completed (flwr run's arguments).")
    sub.add_subcommand("flower-keys", ArgumentParser(description="Make a deployment's TLS certificates and "
                                                                 "SuperNode keys (--out DIR --host A --nodes N)."),
                       help="The certificates and SuperNode keys of a TLS deployment with node authentication.")
    return parser


def _version() -> str:
    """``cosmos-pl X.Y.Z (torch A, lightning B, Python C)``: what a bug report needs."""
    import platform
    from importlib.metadata import PackageNotFoundError, version

    from cosmos_pl import __version__

    def of(package: str) -> str:
        try:
            return version(package)
        except PackageNotFoundError:
            return "not installed"

    return (f"cosmos-pl {__version__} (torch {of('torch')}, lightning {of('lightning')}, flwr {of('flwr')}, "
            f"Python {platform.python_version()})")


def _default_run_dir(cfg: Namespace) -> Path:
    """runs/<config name>-<YYYYmmdd-HHMMSS>; RunDirectory.unique adds -2, -3, ... when it is taken."""
    configs = cfg.get("config") or []
    name = Path(str(configs[-1])).stem if configs else "default"
    return Path("runs") / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"


def run_fit(cfg: Namespace, parser: ArgumentParser, transport: Optional[Callable[..., Any]] = None,
            server: Any = None) -> dict[str, Any]:
    """Run one experiment from a parsed ``fit`` namespace; returns the summary dict.

    ``transport``: ``(runner, config_yaml=..., num_clients=...) -> Clients``, the clients over another transport
    than in-process (:mod:`cosmos_pl.flower`'s ServerApp passes its Flower clients), given the resolved config and
    N; the round loop, records and everything else are shared. ``server``: with a transport, the server's data
    (:class:`~cosmos_pl.federated.server_data.ServerData`: U and the class list) when the clients' data are their
    own (a deployment): no data set is loaded here; without it the configured data set is loaded for U (and, in a
    simulation, the clients').

    The run directory is locked for the whole run (:class:`~cosmos_pl.federated.locks.FolderLock`): a second
    process on it is refused, naming the first.
    """
    from cosmos_pl.federated import checkpoint
    from cosmos_pl.federated.run_directory import RunDirectory

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
        run_dir = RunDirectory.prepare(cfg.run_dir, cfg.overwrite) if cfg.run_dir else \
            RunDirectory.unique(_default_run_dir(cfg))
    try:
        return _fit_in(run_dir, cfg, init, config_yaml, settings_hash, resume, resume_path, transport, server)
    finally:
        run_dir.release()


def _fit_in(run_dir: Any, cfg: Namespace, init: Namespace, config_yaml: str, settings_hash: str,
            resume: Optional[dict[str, Any]], resume_path: Optional[Path],
            transport: Optional[Callable[..., Any]], server: Any = None) -> dict[str, Any]:
    """:func:`run_fit` inside its locked run directory: tracker, data, runner, records, the final line."""
    from lightning.fabric.utilities.seed import seed_everything
    from rich.console import Console

    from cosmos_pl.federated import checkpoint
    from cosmos_pl.federated.recorder import Recorder
    from cosmos_pl.federated.runner import Runner, ServerData
    from cosmos_pl.report import plot_run, print_table
    from cosmos_pl.tracking import Tracker

    console = Console()
    algorithm: Algorithm = init.algorithm
    run_path = run_dir.path
    tracker = Tracker(init.wandb.mode, run_path, _plain(cfg), init.wandb.project, init.wandb.entity, init.wandb.name,
                      init.wandb.tags, run_id=None if resume is None else resume.get("wandb_run_id"))
    try:
        seed_everything(init.seed, verbose=False)
        data_cfg: DataConfig = init.data
        if server is None:
            data, federation = data_cfg.build(init.seed)
            name = data.name
            # over another transport the server keeps U and the class list only: the clients' data stay theirs
            server = federation if transport is None else ServerData(federation.public_x, list(federation.classes))
        else:  # a deployment: the sites hold their own data
            name = f"{data_cfg.num_clients} sites' own data"
        validate_against_data(init, len(server.classes))
        # written once the data is in: a run that failed to load its data leaves no result files behind
        if resume is None:
            run_dir.write_text("config.yaml", config_yaml)
        console.print(f"[bold]cosmos-pl[/bold] {algorithm.name} on {name}: {data_cfg.num_clients} clients, "
                      f"|U| = {len(server.public_x)}, M = {len(server.classes)}; run directory {run_path}")
        runner = Runner(
            server, algorithm, init.clients, rounds=init.rounds, seed=init.seed,
            transformations=init.transformations, trainer=init.trainer, executor=init.executor,
            communication=init.communication, recorder=Recorder(run_dir, tracker), console=console,
            failures=init.failures, checkpoints=init.checkpoint,
            checkpoint_meta={"config_hash": settings_hash, "wandb_run_id": tracker.run_id},
            headline_metric=init.headline_metric, evaluate_every=init.evaluate_every,
            clients_per_round=init.get("clients_per_round"),
            transport=None if transport is None else functools.partial(
                transport, config_yaml=config_yaml, num_clients=init.data.num_clients))
        infos, facts = runner.clients.infos, runner.clients.simulation()
        run_dir.write_json("partition.json", {  # what the clients reported, and a simulation's partition
            "dataset": name, "num_classes": len(server.classes), "classes": list(server.classes),
            "public_set_size": len(server.public_x), "test_set_sizes": [c.test_size for c in infos],
            "validation_set_sizes": [c.validation_size for c in infos], **(facts.partition if facts else {})})
        runner.last_checkpoint = resume_path
        try:
            cache = Path(cfg.round0_cache) if cfg.round0_cache else None
            summary = runner.run(cache, _round0_key(cfg, runner.executor.threads), resume)
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
        parts.append(f"K = {summary['clusters']['K']}, ARI = {summary['clusters']['adjusted_rand_index']}")
    return "; ".join(parts)


def _round0_key(cfg: Namespace, threads: int) -> str:
    """The settings that decide round 0 (data and partition, clients' models and pre-training, augmentation,
    numerics), as text; with what they resolved to on this machine: the device ``trainer.accelerator`` names
    (``auto`` is the GPU on one machine and the CPU on another) and ``threads``, the torch CPU threads per task
    (sums are added in another order with another thread count), so a round 0 trained elsewhere is not reused."""
    import json

    from cosmos_pl.models import BACKBONE_REVISION
    from cosmos_pl.training.config import resolve_device

    parts = {k: cfg[k] for k in ("seed", "data", "transformations", "trainer")}
    parts["backbone_revision"] = BACKBONE_REVISION  # models saved under another definition are not reused
    device = resolve_device(cfg.trainer.accelerator).type
    parts["resolved"] = {"device": device, "threads": threads if device == "cpu" else None}
    clients = cfg.clients.clone()
    del clients["local_epochs"], clients["distill_epochs"], clients["distill_optimizer"]
    parts["clients"] = clients
    return json.dumps(Namespace(parts).as_dict(), sort_keys=True, default=str)


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


def _resume_config(cfg: Namespace, parser: ArgumentParser) -> Namespace:
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


def run(argv: list[str]) -> Any:
    """Parse ``argv`` (e.g. ``["fit", "--config", ...]``) and run it; returns ``fit``'s summary dict or
    ``compare``'s results."""
    parser = build_parser()
    if argv and argv[0] in ("fit", "compare", "export-partition"):  # a class chosen starts from its own defaults
        argv = [argv[0], *class_args(parser._subcommands_action._name_parser_map[argv[0]], argv[1:])]
    cfg = parser.parse_args(argv)
    sub = parser._subcommands_action._name_parser_map[cfg.subcommand]
    if cfg.subcommand == "fit":
        fit = _resume_config(cfg.fit, sub) if cfg.fit.resume else cfg.fit
        return run_fit(fit, sub)
    if cfg.subcommand == "export-partition":
        return run_export(cfg["export-partition"])
    from cosmos_pl.compare import run_compare

    return run_compare(cfg.compare, sub, build_fit_parser())


def resume_line(run_dir: Path, done: int, when: str = "") -> str:
    """``rounds 0..done are saved in RUN_DIR/checkpoints: resume with `cosmos-pl fit --resume RUN_DIR```: what a
    stopped run says (a signal, failing clients, a full disk)."""
    return (f"rounds 0..{done} are saved in {run_dir}/checkpoints: resume{' ' + when if when else ''} with "
            f"`cosmos-pl fit --resume {run_dir}`")


def _interrupted(err: Interrupted, command: str) -> int:
    name = signal.Signals(err.signum).name
    if command == " compare":
        line = f"stopped by {name}; run the same command again to resume (finished pairs are kept, the others " \
               "resume from their last complete round)"
    elif err.run_dir is not None and err.last_round is not None:
        line = f"stopped by {name}; {resume_line(err.run_dir, err.last_round)}"
    elif err.run_dir is not None:
        line = f"stopped by {name} before round 0 ended; nothing to resume: start the run again"
    else:
        line = f"stopped by {name}"
    print(f"cosmos-pl: {line}", file=sys.stderr, flush=True)
    return 128 + err.signum


def _error(message: str) -> int:
    print(f"cosmos-pl: error: {' '.join(str(message).split())}", file=sys.stderr)  # one line
    return 2


def main(argv: list[str] | None = None) -> int:
    """The ``cosmos-pl`` console script.

    Returns the exit status: 0 on success; 2 for a user error (:class:`~cosmos_pl.errors.UserError`, a parse
    error, a missing file), printed as one line on stderr; 1 for an internal fault (any other exception: its
    traceback and where to report it) or when a compare pair failed; 143 on SIGTERM and 130 on SIGINT (Ctrl-C),
    after one line saying how to resume.
    """
    from jsonargparse import ArgumentError

    os.environ.setdefault("PYTHONHASHSEED", "0")
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] == "flower-run":  # flwr run's own arguments, passed on as they are
        from cosmos_pl.flower.run import main as flower_run

        return flower_run(args[1:], prog="cosmos-pl flower-run")
    if args and args[0] == "flower-keys":
        from cosmos_pl.flower.keys import main as flower_keys

        return flower_keys(args[1:])
    command = f" {args[0]}" if args and args[0] in ("fit", "compare", "export-partition") else ""
    # a scheduler's time limit or Ctrl-C: unwind, keep the last complete round, say how to resume, exit 143/130;
    # cosmos_pl.signals records the stop too, so one whose exception was lost still ends here
    previous = signals.install()
    try:
        with signals.converted():
            result = run(args)
            signals.check()
        if argv is None:  # the console script: the results are written, a late SIGTERM must not turn exit 0 into 143
            for s in previous:
                signal.signal(s, signal.SIG_IGN)
            previous = {}
    except Interrupted as err:
        return _interrupted(err, command)
    except ArgumentError as err:  # a parse error: unknown key, wrong type, missing config file
        return _error(f"{err} (options: cosmos-pl{command} --help)")
    except (UserError, FileNotFoundError) as err:  # FileNotFoundError: a config or data file named in the settings
        return _error(str(err))
    except KeyboardInterrupt:
        print("cosmos-pl: interrupted", file=sys.stderr)
        return 130
    except Exception:
        traceback.print_exc()
        print(f"cosmos-pl: internal error (a bug in cosmos-pl): please report it with the command, config.yaml and "
              f"this traceback at {ISSUES_URL}", file=sys.stderr)
        return 1
    finally:
        signals.restore(previous)
    return 1 if getattr(result, "failed", False) else 0


if __name__ == "__main__":
    sys.exit(main())

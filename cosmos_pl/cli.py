"""The ``cosmos-pl`` command line, built with jsonargparse.

``cosmos-pl fit --config FILE [--dotted.overrides]`` trains one algorithm (COSMOS by default) and writes a run
directory; ``cosmos-pl compare --config FILE --algorithms cosmos,fedmd --seeds 0,1,2 --out DIR`` runs every
(algorithm, seed) pair and writes the comparison. ``--print_config`` prints the fully resolved config; ``--help``
documents every option (from the docstrings in :mod:`cosmos_pl.config` and the algorithm classes).

Exit status: 0 on success; 2 for a user error (a bad setting, missing data, a run directory in use, W&B that
cannot start), printed as one line ``cosmos-pl: error: ...`` before any training; 1 for an internal fault (a
traceback and where to report it) or a failed compare pair; 130 when interrupted.
"""

from __future__ import annotations

import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Optional

from jsonargparse import ActionConfigFile, ArgumentParser, Namespace, lazy_instance

from cosmos_pl.algorithms import COSMOS, Algorithm
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
from cosmos_pl.errors import UserError

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
    p.add_argument("--round0_cache", type=Optional[str], default=None,
                   help="Folder keeping trained round-0 client models by a hash of the settings that decide them; "
                        "runs with the same hash load them instead of training (cosmos-pl compare sets it).")
    p.add_argument("--rounds", type=int, default=3,
                   help="R: communication rounds after round 0 (COSMOS: round 1 is the PTC phase, rounds 2.. IFFT).")
    p.add_class_arguments(DataConfig, "data")
    p.add_class_arguments(ClientConfig, "clients")
    p.add_subclass_arguments(Algorithm, "algorithm", default=lazy_instance(COSMOS), required=False,
                             help="The federated algorithm: cosmos_pl.algorithms.COSMOS (default), LocalOnly, FedMD, "
                                  "FedCT, COMET or FedAvg, with its init_args.")
    p.add_class_arguments(Transformations, "transformations")
    p.add_class_arguments(CommunicationConfig, "communication")
    p.add_class_arguments(TrainerConfig, "trainer")
    p.add_class_arguments(ExecutorConfig, "executor")
    p.add_class_arguments(WandbConfig, "wandb")
    p.add_class_arguments(CompareConfig, "comparison")
    return p


def build_compare_parser() -> ArgumentParser:
    p = build_fit_parser()
    p.description = "Run every (algorithm, seed) pair on the same partition per seed and write the comparison."
    p.add_argument("--algorithms", type=Optional[str], default=None,
                   help="Comma-separated short names (cosmos, local, fedmd, fedct, comet, fedavg); "
                        "overrides comparison.algorithms.")
    p.add_argument("--seeds", type=Optional[str], default=None, help="Comma-separated seeds; overrides comparison.seeds.")
    p.add_argument("--jobs", type=Optional[int], default=None, help="Pairs run side by side; overrides comparison.jobs.")
    p.add_argument("--out", type=str, required=True, help="Output folder: one run directory per pair, and the report.")
    return p


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(prog="cosmos-pl", description="cosmos-pl: model-agnostic personalized federated learning.",
                            exit_on_error=False, allow_abbrev=False)
    sub = parser.add_subcommands(required=True)
    sub.add_subcommand("fit", build_fit_parser(), help="Train one algorithm and write a run directory.")
    sub.add_subcommand("compare", build_compare_parser(), help="Compare algorithms over seeds and write a report.")
    return parser


def _default_run_dir(cfg: Namespace) -> Path:
    """runs/<config name>-<YYYYmmdd-HHMMSS>; RunDirectory.unique adds -2, -3, ... when it is taken."""
    configs = cfg.get("config") or []
    name = Path(str(configs[-1])).stem if configs else "default"
    return Path("runs") / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"


def run_fit(cfg: Namespace, parser: ArgumentParser) -> dict[str, Any]:
    """Run one experiment from a parsed ``fit`` namespace; returns the summary dict."""
    from lightning.fabric.utilities.seed import seed_everything
    from rich.console import Console

    from cosmos_pl.data import build_federation
    from cosmos_pl.federated.recorder import Recorder
    from cosmos_pl.federated.run_directory import RunDirectory
    from cosmos_pl.federated.runner import Runner
    from cosmos_pl.report import plot_run, print_table
    from cosmos_pl.tracking import Tracker

    console = Console()
    saved = cfg.clone()
    saved.overwrite = False  # config.yaml describes the run; rerunning it must not clear a folder unasked
    config_yaml = parser.dump(saved, skip_unset=False)
    # every user error is found here, before any data is loaded: settings, the run directory, W&B
    init = parser.instantiate(cfg)
    validate_config(init)
    algorithm: Algorithm = init.algorithm
    run_dir = RunDirectory.prepare(cfg.run_dir, cfg.overwrite) if cfg.run_dir else \
        RunDirectory.unique(_default_run_dir(cfg))
    run_path = run_dir.path
    tracker = Tracker(init.wandb.mode, run_path, _plain(cfg),
                      init.wandb.project, init.wandb.entity, init.wandb.name, init.wandb.tags)
    try:
        seed_everything(init.seed, verbose=False)
        data_cfg: DataConfig = init.data
        data = data_cfg.dataset.load()
        federation = build_federation(
            data, data_cfg.partitioner, data_cfg.num_clients, public_fraction=data_cfg.public_fraction,
            test_samples_per_client=data_cfg.test_samples_per_client, max_train_samples=data_cfg.max_train_samples,
            validation_fraction=data_cfg.validation_fraction, seed=init.seed,
        )
        validate_against_data(init, federation.num_classes)
        # written once the data is in: a run that failed to load its data leaves no result files behind
        run_dir.write_text("config.yaml", config_yaml)
        run_dir.write_json("partition.json", {
            "dataset": data.name, "num_classes": federation.num_classes, "classes": federation.classes,
            "public_set_size": len(federation.public_x),
            "test_set_sizes": [len(c.y_test) for c in federation.clients],
            "validation_set_sizes": [0 if c.y_val is None else len(c.y_val) for c in federation.clients],
            **federation.partition.to_json(federation.partition_labels, federation.num_classes),
        })
        console.print(f"[bold]cosmos-pl[/bold] {algorithm.name} on {data.name}: {len(federation.clients)} clients, "
                      f"|U| = {len(federation.public_x)}, M = {federation.num_classes}; run directory {run_path}")
        runner = Runner(federation, algorithm, init.clients, rounds=init.rounds, seed=init.seed,
                        transformations=init.transformations, trainer=init.trainer, executor=init.executor,
                        communication=init.communication, recorder=Recorder(run_dir, tracker), console=console)
        summary = runner.run(Path(cfg.round0_cache) if cfg.round0_cache else None, _round0_key(cfg))
    finally:
        tracker.finish()
    print_table(runner.recorder.rows, console, title=f"{algorithm.name}: personalized accuracy per round")
    plot_run(runner.recorder.rows, run_path / "accuracy_vs_round.png",
             f"{algorithm.name} on {data.name}, seed {init.seed}: accuracy per round")
    final, local = summary["final"], summary["local_only"]
    teacher = final.get("teacher_acc", {}).get("mean")
    parts = [f"final round {final['round']}: {summary['scored_model']} "
             f"{final['personalized_acc']['mean']:.4f} ± {final['personalized_acc']['sem']:.4f}"]
    if teacher is not None and algorithm.scored != "teacher":
        parts.append(f"teacher {teacher:.4f}")
    if algorithm.scored == "teacher":
        parts.append(f"client f_i {final['client_acc']['mean']:.4f}")
    parts.append(f"local-only (round 0) {local['client_acc']['mean']:.4f}")
    if summary["clusters"]["K"] is not None:
        parts.append(f"K = {summary['clusters']['K']}, ARI = {summary['clusters']['adjusted_rand_index']}")
    console.print("; ".join(parts) + f"; {summary['wall_seconds']:.0f} s. Files in {run_path}")
    return summary


def _round0_key(cfg: Namespace) -> str:
    """The settings that decide round 0 (data and partition, clients' models and pre-training, augmentation,
    numerics), as text."""
    import json

    from cosmos_pl.models import BACKBONE_REVISION

    parts = {k: cfg[k] for k in ("seed", "data", "transformations", "trainer")}
    parts["backbone_revision"] = BACKBONE_REVISION  # models saved under another definition are not reused
    clients = cfg.clients.clone()
    del clients["local_epochs"], clients["distill_epochs"], clients["distill_optimizer"]
    parts["clients"] = clients
    return json.dumps(Namespace(parts).as_dict(), sort_keys=True, default=str)


def _plain(cfg: Namespace) -> dict[str, Any]:
    return {k: v for k, v in cfg.clone().as_dict().items() if k not in ("config", "comparison", "overwrite")}


def run(argv: list[str]) -> Any:
    """Parse ``argv`` (e.g. ``["fit", "--config", ...]``) and run it; returns ``fit``'s summary dict or
    ``compare``'s results."""
    parser = build_parser()
    cfg = parser.parse_args(argv)
    sub = parser._subcommands_action._name_parser_map[cfg.subcommand]
    if cfg.subcommand == "fit":
        return run_fit(cfg.fit, sub)
    from cosmos_pl.compare import run_compare

    return run_compare(cfg.compare, sub, build_fit_parser())


def _error(message: str) -> int:
    print(f"cosmos-pl: error: {' '.join(str(message).split())}", file=sys.stderr)  # one line
    return 2


def main(argv: list[str] | None = None) -> int:
    """The ``cosmos-pl`` console script.

    Returns the exit status: 0 on success; 2 for a user error (:class:`~cosmos_pl.errors.UserError`, a parse
    error, a missing file), printed as one line on stderr; 1 for an internal fault (any other exception: its
    traceback and where to report it) or when a compare pair failed; 130 on Ctrl-C.
    """
    from jsonargparse import ArgumentError

    os.environ.setdefault("PYTHONHASHSEED", "0")
    args = sys.argv[1:] if argv is None else argv
    command = f" {args[0]}" if args and args[0] in ("fit", "compare") else ""
    try:
        result = run(args)
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
    return 1 if getattr(result, "failed", False) else 0


if __name__ == "__main__":
    sys.exit(main())

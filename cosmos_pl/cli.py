"""``cosmos-pl fit --config FILE [--dotted.overrides]``: the command line, built with jsonargparse.

``cosmos-pl fit --print_config`` prints the fully resolved config; ``cosmos-pl fit --help`` documents every
option (from the dataclass docstrings in :mod:`cosmos_pl.config`).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any, Optional

from jsonargparse import ActionConfigFile, ArgumentParser, Namespace

from cosmos_pl.config import (
    ClientConfig,
    CommunicationConfig,
    CosmosConfig,
    DataConfig,
    ExecutorConfig,
    ServerConfig,
    TrainerConfig,
    WandbConfig,
)

__all__ = ["build_parser", "main", "run", "run_fit"]


def build_fit_parser() -> ArgumentParser:
    p = ArgumentParser(description="Train COSMOS: heterogeneous clients, clustered server teachers, pseudo-labels only.",
                       exit_on_error=True)
    p.add_argument("--config", action=ActionConfigFile, help="YAML config file (configs/*.yaml); later flags override it.")
    p.add_argument("--seed", type=int, default=0, help="One seed for Python, NumPy, torch, the partition and every stage.")
    p.add_argument("--run_dir", type=Optional[str], default=None,
                   help="Run directory (default: runs/<config name>-<YYYYmmdd-HHMMSS>).")
    p.add_class_arguments(DataConfig, "data")
    p.add_class_arguments(ClientConfig, "clients")
    p.add_class_arguments(ServerConfig, "server")
    p.add_class_arguments(CosmosConfig, "cosmos")
    p.add_class_arguments(CommunicationConfig, "communication")
    p.add_class_arguments(TrainerConfig, "trainer")
    p.add_class_arguments(ExecutorConfig, "executor")
    p.add_class_arguments(WandbConfig, "wandb")
    return p


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(prog="cosmos-pl", description="cosmos-pl: model-agnostic personalized federated learning.")
    sub = parser.add_subcommands(required=True)
    sub.add_subcommand("fit", build_fit_parser(), help="Train COSMOS and write a run directory.")
    return parser


def _default_run_dir(cfg: Namespace) -> Path:
    configs = cfg.get("config") or []
    name = Path(str(configs[-1])).stem if configs else "default"
    return Path("runs") / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"


def run_fit(cfg: Namespace, parser: ArgumentParser) -> dict[str, Any]:
    """Run one experiment from a parsed ``fit`` namespace; returns the summary dict."""
    from lightning.fabric.utilities.seed import seed_everything
    from rich.console import Console

    from cosmos_pl.data import build_federation
    from cosmos_pl.federated.loop import FederatedLoop
    from cosmos_pl.federated.records import RunDirectory
    from cosmos_pl.report import print_table
    from cosmos_pl.tracking import Tracker

    console = Console()
    run_path = Path(cfg.run_dir) if cfg.run_dir else _default_run_dir(cfg)
    config_yaml = parser.dump(cfg, skip_unset=False)
    init = parser.instantiate(cfg)
    seed_everything(init.seed, verbose=False)

    data_cfg: DataConfig = init.data
    data = data_cfg.dataset.load()
    federation = build_federation(
        data, data_cfg.partitioner, data_cfg.num_clients, public_fraction=data_cfg.public_fraction,
        test_samples_per_client=data_cfg.test_samples_per_client, max_train_samples=data_cfg.max_train_samples,
        seed=init.seed,
    )
    run_dir = RunDirectory(run_path)
    run_dir.write_text("config.yaml", config_yaml)
    labels_np = _client_labels(federation)
    run_dir.write_json("partition.json", {
        "dataset": data.name, "num_classes": federation.num_classes, "classes": federation.classes,
        "public_set_size": len(federation.public_x),
        "test_set_sizes": [len(c.y_test) for c in federation.clients],
        **federation.partition.to_json(labels_np, federation.num_classes),
    })
    console.print(f"[bold]cosmos-pl[/bold] {data.name}: {len(federation.clients)} clients, |U| = {len(federation.public_x)}, "
                  f"M = {federation.num_classes}; run directory {run_path}")
    tracker = Tracker(init.wandb.mode, run_path, _plain(cfg),
                      init.wandb.project, init.wandb.entity, init.wandb.name, init.wandb.tags)
    try:
        loop = FederatedLoop(federation, init.clients, init.server, init.cosmos, init.trainer, init.seed,
                             run_dir, tracker, console, executor=init.executor, communication=init.communication)
        summary = loop.run()
    finally:
        tracker.finish()
    print_table(loop.rows, console)
    final, local = summary["final"], summary["local_only"]
    console.print(
        f"final round {final['round']}: teacher h_pi(i) {final['teacher_acc']['mean']:.4f} ± {final['teacher_acc']['sem']:.4f}, "
        f"client f_i {final['client_acc']['mean']:.4f}; local-only (round 0) {local['client_acc']['mean']:.4f}; "
        f"K = {summary['clusters']['K']}, ARI = {summary['clusters']['adjusted_rand_index']}; "
        f"{summary['wall_seconds']:.0f} s. Files in {run_path}"
    )
    return summary


def _client_labels(federation) -> Any:
    """The partitioned labels array the partition's indices point into, rebuilt from the clients' labels."""
    import numpy as np

    n = sum(len(ix) for ix in federation.partition.client_indices)
    labels = np.zeros(n, dtype=np.int64)
    for ix, c in zip(federation.partition.client_indices, federation.clients):
        labels[np.asarray(ix)] = c.y.numpy()
    return labels


def _plain(cfg: Namespace) -> dict[str, Any]:
    return {k: v for k, v in cfg.clone().as_dict().items() if k != "config"}


def run(argv: list[str]) -> dict[str, Any] | None:
    """Parse ``argv`` (e.g. ``["fit", "--config", ...]``) and run it; returns the summary dict of ``fit``."""
    parser = build_parser()
    cfg = parser.parse_args(argv)
    if cfg.subcommand == "fit":
        fit_parser = parser._subcommands_action._name_parser_map["fit"]
        return run_fit(cfg.fit, fit_parser)
    return None


def main(argv: list[str] | None = None) -> int:
    """The ``cosmos-pl`` console script: exit status 0 on success, 2 on a bad setting or missing data."""
    os.environ.setdefault("PYTHONHASHSEED", "0")
    try:
        run(sys.argv[1:] if argv is None else argv)
    except (ValueError, FileNotFoundError) as err:
        # settings checked after parsing (partition, data set, thresholds) name the field and the fix
        print(f"cosmos-pl: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

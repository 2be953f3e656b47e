"""The settings of ``cosmos-pl``'s subcommands: the parsers of ``fit``, ``compare`` and ``export-partition``.

Each parser lists every setting its subcommand takes, with its type, default and help (from the docstrings in
:mod:`cosmos_pl.config` and the algorithm classes); ``compare`` and ``export-partition`` take every ``fit`` setting
and add their own. :mod:`cosmos_pl.cli` gathers them as subcommands; :func:`cosmos_pl.fit.run_fit`, the compare
command and the Flower apps read configs with them.
"""

from __future__ import annotations

import inspect
import sys
from typing import Literal, Optional, Union

from jsonargparse import ActionConfigFile, lazy_instance

from cosmos_pl.algorithms import ALGORITHMS, COSMOS, Algorithm
from cosmos_pl.config import (
    ClientConfig,
    CommunicationConfig,
    CompareConfig,
    DataConfig,
    ExecutorConfig,
    SlurmConfig,
    TrainerConfig,
    Transformations,
    WandbConfig,
)
from cosmos_pl.docstrings import ArgumentParser  # --help prints the docstrings' roles as plain text
from cosmos_pl.runs.checkpoint import CheckpointConfig
from cosmos_pl.federated.failures import FailureConfig

__all__ = ["build_fit_parser", "build_compare_parser", "build_export_parser", "algorithm_help"]

_OTHER_ALGORITHMS = [cls.__name__ for cls in ALGORITHMS.values() if cls is not COSMOS]


def build_fit_parser() -> ArgumentParser:
    """The ``fit`` parser: one run's every setting (data, clients, algorithm, executor, records, ...)."""
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
    p.add_argument("--round0_only", type=bool, default=False,
                   help="Train round 0 into --round0_cache and stop: no rounds and no records beyond config.yaml and "
                        "partition.json (cosmos-pl compare --launcher slurm runs its round-0 jobs so).")
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
                             help="The federated algorithm: cosmos_pl.algorithms.COSMOS (default), "
                                  f"{', '.join(_OTHER_ALGORITHMS[:-1])} or {_OTHER_ALGORITHMS[-1]}, with its "
                                  "init_args.")
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
    """The ``compare`` parser: every ``fit`` setting, and the algorithms, seeds, side-by-side jobs, output folder,
    grid and dry run of a comparison."""
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
    p.add_argument("--launcher", type=Literal["local", "slurm"], default="local",
                   help="Where the pairs run: 'local' (on this machine, --jobs side by side) or 'slurm' (each pair a "
                        "Slurm job submitted with submitit, resources from the slurm group; round 0 once per seed "
                        "as a job the pairs depend on; a pre-empted or timed-out job requeues itself and resumes).")
    p.add_class_arguments(SlurmConfig, "slurm")
    p.add_argument("--dry_run", type=bool, default=False,
                   help="Check every pair's config as a run would, print what would run (with --grid: per point), and "
                        "exit 0; runs nothing and writes nothing under --out.")
    return p


def build_export_parser() -> ArgumentParser:
    """The ``export-partition`` parser: every ``fit`` setting, and the folder to write the sites into."""
    p = build_fit_parser()
    p.description = ("Write the federation a `fit` config makes (its data set, partition, U and test sets; the seed) "
                     "as folders: OUT/client_<i>/data.npz per client, OUT/public.npz for U and the class list. Give "
                     "each site only its own folder (flower-supernode --node-config \"partition-id=<i> "
                     "data='OUT/client_<i>'\"); `fit --data.dataset cosmos_pl.data.SiteFolders "
                     "--data.dataset.root OUT` simulates the same federation from the folders.")
    p.add_argument("--out", type=str, required=True, help="Folder to write the sites into (must be empty or new).")
    return p


def _paragraphs(doc: Optional[str]) -> list[str]:
    """A docstring's paragraphs, each on one line."""
    return [" ".join(par.split()) for par in inspect.cleandoc(doc or "").split("\n\n") if par.strip()]


def _module_summary(cls: type) -> str:
    """The first paragraph of an algorithm's module docstring, without a leading ``"FedMD: "``."""
    return " ".join(_paragraphs(sys.modules[cls.__module__].__doc__)[:1]).removeprefix(f"{cls.__name__}: ")


def algorithm_help(argv: list[str], prog: str) -> Optional[str]:
    """What ``--algorithm.help NAME`` at the end of ``argv`` (one subcommand's arguments) prints, or None when
    ``argv`` does not end so (jsonargparse then answers as usual); without NAME, the list of algorithms.

    NAME is what ``--algorithm`` takes: a short name (``fedmd``), a class name in any case (``FedMD``) or a class
    path. The text is the algorithm's description (its module's summary and the model it scores) and its own
    settings under its class's summary; one without settings of its own (LocalOnly, FedAvg) says so. (jsonargparse's
    own ``--algorithm.help`` takes class paths only, and prints nothing for a class without settings.)

    Raises:
        ConfigError: an unknown algorithm name, with the closest valid one and the list.
    """
    from cosmos_pl.class_groups import algorithm_named

    if argv and argv[-1] == "--algorithm.help":  # no NAME: which there are
        width = max(len(name) for name in ALGORITHMS)
        return "\n".join([f"usage: {prog} --algorithm.help NAME", "", "The algorithms (NAME, its class, what it does):",
                          *(f"  {name:<{width}}  {cls.__name__}: {_module_summary(cls)}"
                            for name, cls in ALGORITHMS.items())]) + "\n"
    if len(argv) >= 2 and argv[-2] == "--algorithm.help" and not argv[-1].startswith("-"):
        name = argv[-1]
    elif argv and argv[-1].startswith("--algorithm.help="):
        name = argv[-1].split("=", 1)[1]
    else:
        return None
    cls = algorithm_named(name, "--algorithm.help")
    if not (isinstance(cls, type) and issubclass(cls, Algorithm)):  # jsonargparse names what is wrong with it
        return None
    scored = [par for par in _paragraphs(sys.modules[cls.__module__].__doc__) if par.startswith("Scored model:")]
    summary = " ".join([_module_summary(cls), *scored])
    parser = ArgumentParser(prog=prog, description=f"{cls.__name__} (--algorithm {cls.name}): {summary}",
                            add_help=False)
    parser.add_class_arguments(cls, "algorithm")
    for actions in (parser._actions, *(group._group_actions for group in parser._action_groups)):
        actions[:] = [a for a in actions if a.dest != "algorithm"]  # the group's config-file flag: not this --algorithm
    if not any(action.dest.startswith("algorithm.") for action in parser._actions):
        parser.description += (f" {' '.join(_paragraphs(cls.__doc__)[:1])} {cls.__name__} has no settings of its "
                               "own: its clients train with the clients group's (clients.local_epochs, ...).")
    return parser.format_help()

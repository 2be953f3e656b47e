"""The experiment configuration: typed, documented groups that jsonargparse turns into the CLI and YAML.

Every field's docstring line becomes its ``--help`` text; unknown keys and wrong types are parse errors.
This module sits at the top of the import graph: it gathers the settings classes that live beside the code
they configure (clients, trainer, executor, communication, transformations) and adds the experiment-level ones.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Optional

from jsonargparse import lazy_instance

from cosmos_pl.communication import CommunicationConfig
from cosmos_pl.data import FashionMNIST, GroupDirichlet, ImageDataset, Partitioner
from cosmos_pl.federated.client import ClientConfig
from cosmos_pl.federated.executor import ExecutorConfig
from cosmos_pl.federated.stages import TrainerConfig
from cosmos_pl.transforms import Transformations

__all__ = [
    "DataConfig", "ClientConfig", "CommunicationConfig", "WandbConfig", "TrainerConfig", "ExecutorConfig",
    "CompareConfig", "Transformations",
]


@dataclass
class DataConfig:
    """The data set, its split among clients, and the public set U.

    Args:
        dataset: the labelled image data set (class_path: cosmos_pl.data.FashionMNIST, CIFAR10, NpzData, ...).
        partitioner: how the labelled part is split among clients (GroupDirichlet = the paper's, Dirichlet, IID).
        num_clients: N, the number of clients.
        public_fraction: fraction of the training split held out as the public unlabelled set U (paper: 0.2).
        test_samples_per_client: size of each client's test set, drawn to match its label distribution.
        max_train_samples: class-stratified subsample of the training split before anything else (None: all).
        validation_fraction: fraction of each client's data held out (stratified, seeded) as its validation set, scored every round beside the test set; settings are chosen on it, never on test accuracy (0: none).
    """

    dataset: ImageDataset = lazy_instance(FashionMNIST)
    partitioner: Partitioner = lazy_instance(GroupDirichlet)
    num_clients: int = 20
    public_fraction: float = 0.2
    test_samples_per_client: int = 1000
    max_train_samples: Optional[int] = None
    validation_fraction: float = 0.0


@dataclass
class WandbConfig:
    """Weights & Biases tracking: one run per experiment, stepped by round.

    Args:
        mode: 'offline' (default: files under the run directory, sync later with `wandb sync`), 'online' or 'disabled'.
        project: W&B project name.
        entity: W&B entity (team or user); None uses your default.
        name: run name; None uses the run directory's name.
        tags: run tags.
    """

    mode: Literal["offline", "online", "disabled"] = "offline"
    project: str = "cosmos-pl"
    entity: Optional[str] = None
    name: Optional[str] = None
    tags: list[str] = field(default_factory=list)


@dataclass
class CompareConfig:
    """What `cosmos-pl compare` runs (the `comparison` group; `cosmos-pl fit` ignores it).

    Args:
        algorithms: short names of the algorithms to compare: cosmos, local, fedmd, fedct, comet, fedavg.
        seeds: seeds; every algorithm runs once per seed, on the same partition for the same seed.
        settings: init_args per algorithm name (e.g. {comet: {num_clusters: 5}}); for cosmos the `algorithm` group is used when it is COSMOS and no entry is given here.
        jobs: pairs run side by side, the CPU cores split between them (1: one after another).
    """

    algorithms: list[str] = field(default_factory=lambda: ["cosmos", "comet", "fedct", "fedmd", "local"])
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    settings: dict[str, dict[str, Any]] = field(default_factory=dict)
    jobs: int = 1

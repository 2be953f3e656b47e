"""The experiment configuration: typed, documented groups that jsonargparse turns into the CLI and YAML.

Every field's docstring line becomes its ``--help`` text; unknown keys and wrong types are parse errors.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Optional, Union

from jsonargparse import lazy_instance
from lightning.pytorch.cli import OptimizerCallable

from cosmos_pl.data import FashionMNIST, GroupDirichlet, ImageDataset, Partitioner
from cosmos_pl.communication import UploadDtype
from cosmos_pl.federated.executor import ExecutorConfig
from cosmos_pl.federated.stages import TrainerConfig
from cosmos_pl.transforms import Transformations

__all__ = [
    "DataConfig", "ClientConfig", "ServerConfig", "CosmosConfig", "CommunicationConfig", "WandbConfig",
    "TrainerConfig", "ExecutorConfig",
]


def _adam(lr: float):
    return field(default_factory=lambda: {"class_path": "torch.optim.Adam", "init_args": {"lr": lr}})


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
    """

    dataset: ImageDataset = lazy_instance(FashionMNIST)
    partitioner: Partitioner = lazy_instance(GroupDirichlet)
    num_clients: int = 20
    public_fraction: float = 0.2
    test_samples_per_client: int = 1000
    max_train_samples: Optional[int] = None


@dataclass
class ClientConfig:
    """The clients: heterogeneous backbones and their two objectives.

    Args:
        backbones: timm (or torchvision alexnet/squeezenet1_0/squeezenet1_1) names, assigned to clients round-robin.
        pretrain_epochs: E0, local epochs of cross-entropy before the first upload (PTC phase).
        local_epochs: local cross-entropy epochs at the start of every IFFT round.
        distill_epochs: epochs over U distilling the cluster teacher's pseudo-labels (Eq. 2) every round.
        batch_size: batch size of both objectives.
        optimizer: optimizer on labels (paper: Adam lr 1e-3).
        distill_optimizer: optimizer on pseudo-labels (paper: Adam lr 1e-4).
    """

    backbones: list[str] = field(default_factory=lambda: ["mobilenetv3_small_050", "lcnet_050"])
    pretrain_epochs: int = 5
    local_epochs: int = 1
    distill_epochs: int = 1
    batch_size: int = 64
    optimizer: OptimizerCallable = _adam(1e-3)
    distill_optimizer: OptimizerCallable = _adam(1e-4)


@dataclass
class ServerConfig:
    """The server: clustering (Algorithm 1), aggregation and the cluster teachers (Eq. 1).

    Args:
        backbone: the teachers' architecture (paper: vgg16), created once per cluster.
        b0: the clustering threshold B0 on the L1 distance per public sample (in [0, 2]); 'auto': the B0 whose Algorithm 1 clustering has the best silhouette on the distances; 'otsu': Otsu's threshold on them; 'inf': one cluster.
        distance: client distance, 'l1' (the paper's) or 'l2'.
        aggregation: how a cluster's pseudo-labels are combined: mean (paper), median or max.
        ptc_epochs: teacher epochs over U in the PTC phase (round 1), training from scratch.
        distill_epochs: teacher fine-tuning epochs over U in every IFFT round.
        batch_size: teacher batch size.
        optimizer: teacher optimizer (paper: Adam lr 1e-4); in the PTC round the teachers train from scratch with it.
        finetune_optimizer: teacher optimizer in IFFT rounds (fine-tuning); null uses `optimizer`.
    """

    backbone: str = "resnet10t"
    b0: Union[float, Literal["auto", "otsu", "inf"]] = "auto"
    distance: Literal["l1", "l2"] = "l1"
    aggregation: Literal["mean", "median", "max"] = "mean"
    ptc_epochs: int = 5
    distill_epochs: int = 1
    batch_size: int = 128
    optimizer: OptimizerCallable = _adam(1e-4)
    finetune_optimizer: Optional[OptimizerCallable] = None


@dataclass
class CosmosConfig:
    """The algorithm's own settings (COSMOS paper, Sections 4.1-4.2).

    Args:
        rounds: communication rounds after local pre-training: round 1 is the PTC phase, rounds 2.. are IFFT rounds.
        lambda_: lambda, the weight of the consistency regularizer r_B in Eq. 1 and 2 (paper: 5).
        temperature: T applied to pseudo-labels before distillation; 1 keeps them, 0 makes them one-hot (paper: 1).
        num_views: |S|, perturbed views per public sample and step in r_B.
        consistency_target_grad: back-propagate r_B into the clean prediction g(x) as well as the views g(x'); false (default) holds g(x) fixed as r_B's target.
        transformations: the permissible transformations T and perturbation radius d of r_B (also used as augmentation on labelled data).
    """

    rounds: int = 3
    lambda_: float = 5.0
    temperature: float = 1.0
    num_views: int = 1
    consistency_target_grad: bool = False
    transformations: Transformations = field(default_factory=Transformations)


@dataclass
class CommunicationConfig:
    """How clients' uploads are encoded; bytes are counted exactly (summary.json, metrics.csv).

    Args:
        upload_dtype: float32 (default), float16, or uint8 (each probability quantized to round(255 p), renormalized on arrival).
        top_k: send only the k largest probabilities per public sample with their class indices; the dropped mass is spread evenly over the other classes on arrival. null sends all M.
    """

    upload_dtype: UploadDtype = "float32"
    top_k: Optional[int] = None


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

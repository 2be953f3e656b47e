"""Data sets, partitioners and the federation builder of cosmos-pl."""

from .datasets import (
    CIFAR10,
    CIFAR100,
    DATASETS,
    Digits,
    EMNISTBalanced,
    FashionMNIST,
    ImageData,
    ImageDataset,
    ImageFolderData,
    NpzData,
    TinyImageNet,
    get_dataset,
)
from .federation import ClientData, Federation, build_federation
from .partition import (
    IID,
    Dirichlet,
    GroupDirichlet,
    Partition,
    Partitioner,
    dirichlet,
    group_dirichlet,
    iid,
)

__all__ = [
    "ImageData",
    "ImageDataset",
    "FashionMNIST",
    "Digits",
    "CIFAR10",
    "CIFAR100",
    "EMNISTBalanced",
    "TinyImageNet",
    "ImageFolderData",
    "NpzData",
    "DATASETS",
    "get_dataset",
    "Partition",
    "Partitioner",
    "GroupDirichlet",
    "Dirichlet",
    "IID",
    "group_dirichlet",
    "dirichlet",
    "iid",
    "ClientData",
    "Federation",
    "build_federation",
]

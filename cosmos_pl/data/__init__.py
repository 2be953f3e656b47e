"""The data of cosmos-pl: data sets, partitioners, the federation builder and a federation as site folders.

The data sets (:mod:`~cosmos_pl.data.datasets`: images in memory as uint8 tensors), the partitioners
(:mod:`~cosmos_pl.data.partition`: which training samples each client holds), the federation
(:mod:`~cosmos_pl.data.federation`: every client's data, U and the per-client test sets) and the sites
(:mod:`~cosmos_pl.data.sites`: a federation written as one folder per site, and read back). Configs name the
classes here as ``cosmos_pl.data.<Class>``.
"""

from .datasets import (
    CIFAR10,
    CIFAR100,
    DATASETS,
    CIFAR10Subset,
    Digits,
    EMNISTBalanced,
    FashionMNIST,
    ImageData,
    ImageDataset,
    ImageFolderData,
    NpzData,
    TinyImageNet,
    check_image_data,
    get_dataset,
)
from .federation import MIN_TRAIN_SAMPLES, ClientData, Federation, build_federation
from .sites import SiteFolders, export_federation, load_public, load_site
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
    "CIFAR10Subset",
    "DATASETS",
    "get_dataset",
    "check_image_data",
    "MIN_TRAIN_SAMPLES",
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
    "SiteFolders",
    "export_federation",
    "load_public",
    "load_site",
]

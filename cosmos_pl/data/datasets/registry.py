"""The data sets by short name: :data:`DATASETS` and :func:`get_dataset`."""

from __future__ import annotations

import difflib

from cosmos_pl.errors import ConfigError

from .archives import CIFAR10Subset, NpzData
from .base import ImageDataset
from .folders import ImageFolderData, TinyImageNet
from .packaged import CIFAR10, CIFAR100, Digits, EMNISTBalanced, FashionMNIST

__all__ = ["DATASETS", "get_dataset"]


DATASETS: dict[str, type[ImageDataset]] = {
    "fashion_mnist": FashionMNIST,
    "digits": Digits,
    "cifar10": CIFAR10,
    "cifar100": CIFAR100,
    "emnist_balanced": EMNISTBalanced,
    "tiny_imagenet": TinyImageNet,
    "image_folder": ImageFolderData,
    "npz": NpzData,
    "cifar10_subset": CIFAR10Subset,
}


def get_dataset(name: str, **kwargs) -> ImageDataset:
    """Instantiate a data set by short name, e.g. ``get_dataset("digits", split_seed=1)``.

    Raises:
        ConfigError: unknown name; the message lists the valid names and a close match.
    """
    if name not in DATASETS:
        close = difflib.get_close_matches(name, list(DATASETS), n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ConfigError(f"unknown dataset {name!r}; valid names: {sorted(DATASETS)}.{hint}")
    return DATASETS[name](**kwargs)

"""Image-classification data sets loaded fully into memory as uint8 tensors.

Each data set is a small class whose ``__init__`` takes typed keyword settings, so that
configs can choose it with ``class_path`` / ``init_args`` (jsonargparse). ``load()``
returns an :class:`ImageData`. A data set that cannot be found (no files, and download
off or failing offline) raises ``FileNotFoundError`` naming the paths looked at and how
to get the data. Every loaded :class:`ImageData` is checked on construction
(:func:`check_image_data`): a broken archive fails at load with a ``DataError`` naming the
data set, the file and the field, not minutes into training.

The folder holds the data sets by where their data come from: :mod:`~cosmos_pl.data.datasets.base`
(:class:`ImageData`, its checks, the base class :class:`ImageDataset` and the loaders' common steps),
:mod:`~cosmos_pl.data.datasets.packaged` (what a library packages: Fashion-MNIST, scikit-learn's digits, CIFAR-10,
CIFAR-100, EMNIST Balanced), :mod:`~cosmos_pl.data.datasets.folders` (image files: Tiny ImageNet, any ImageFolder
tree), :mod:`~cosmos_pl.data.datasets.archives` (NumPy archives: any ``.npz``, the CIFAR-10 subset) and
:mod:`~cosmos_pl.data.datasets.registry` (the data sets by short name). Configs name them as
``cosmos_pl.data.<Class>``. The modules are imported in this order, which is the order ``--help`` lists the classes
in.
"""

# in this order, not sorted: the classes are defined in the order --help lists them in
from .base import ImageData, ImageDataset, check_image_data
from .packaged import CIFAR10, CIFAR100, Digits, EMNISTBalanced, FashionMNIST
from .folders import ImageFolderData, TinyImageNet
from .archives import CIFAR10Subset, NpzData, balanced_subset
from .registry import DATASETS, get_dataset

__all__ = [
    "ImageData",
    "check_image_data",
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
    "balanced_subset",
    "DATASETS",
    "get_dataset",
]

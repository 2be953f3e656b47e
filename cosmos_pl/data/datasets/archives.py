"""The data sets read from NumPy ``.npz`` archives: :class:`NpzData` (any archive), and :class:`CIFAR10Subset` (the
CIFAR-10 subset shipped as an archive, else the same recipe applied to torchvision's CIFAR-10)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from cosmos_pl.errors import ConfigError, DataError

from .base import ImageData, ImageDataset, data_not_found, from_numpy, torchvision_pair

__all__ = ["NpzData", "CIFAR10Subset", "balanced_subset"]


class NpzData(ImageDataset):
    """A NumPy ``.npz`` archive with x_train, y_train, x_test, y_test and classes."""

    name = "npz"

    def __init__(self, path: str = "../shared/data/cifar10_subset.npz") -> None:
        """Configure the loader.

        Args:
            path: the archive (relative paths are taken from the working directory).
                Images are uint8 [N, H, W, C] (or [N, H, W] grayscale), labels int [N],
                ``classes`` an array of names (optional: defaults to "0".."M-1").
        """
        self.path = path

    def load(self) -> ImageData:
        """Load the archive (no pickle); x becomes uint8 [N, C, H, W].

        Raises:
            FileNotFoundError: the file does not exist.
            DataError: a required array is missing, or the arrays fail :func:`~cosmos_pl.data.datasets.base.check_image_data` (shapes,
                dtypes, label range), naming the file and the array.
        """
        if not Path(self.path).is_file():
            raise data_not_found("npz", [self.path],
                                 "pass path: to an .npz with x_train, y_train, x_test, y_test, classes")
        with np.load(self.path) as z:
            missing = [k for k in ("x_train", "y_train", "x_test", "y_test") if k not in z.files]
            if missing:
                raise DataError(f"data set {Path(self.path).stem!r} ({self.path}) lacks arrays {missing}; it has "
                                f"{z.files}: save x_train, y_train, x_test, y_test (and classes) with np.savez")
            arrays = {}
            for key in ("x_train", "y_train", "x_test", "y_test", *(["classes"] if "classes" in z.files else [])):
                try:
                    arrays[key] = z[key]
                except ValueError as err:  # an object array needs pickle, which is never allowed
                    raise DataError(f"data set {Path(self.path).stem!r} ({self.path}): array {key} cannot be read "
                                    f"without pickle ({err}); save it as numbers (images uint8, labels int64, classes "
                                    "a fixed-width string array)") from None
            ytr, yte = arrays["y_train"], arrays["y_test"]
            for key, y in (("y_train", ytr), ("y_test", yte)):
                if y.size and not np.issubdtype(y.dtype, np.integer):
                    raise DataError(f"data set {Path(self.path).stem!r} ({self.path}): field {key} has dtype "
                                    f"{y.dtype}; labels must be integer class indices into classes: map the names to "
                                    "indices and save them with .astype(np.int64)")
            if "classes" in arrays:
                classes = [str(c) for c in arrays["classes"]]
            else:
                classes = [str(k) for k in range(int(max(ytr.max(initial=-1), yte.max(initial=-1))) + 1)]
            return from_numpy(Path(self.path).stem, arrays["x_train"], ytr, arrays["x_test"], yte, classes,
                               channels_last=True, source=str(self.path))


def balanced_subset(labels: np.ndarray, per_class: int, seed: int) -> np.ndarray:
    """Sorted indices of ``per_class`` random samples of every class of ``labels`` [N], drawn with
    ``numpy.random.default_rng(seed)`` class by class in class order.

    Raises:
        ConfigError: a class has fewer than ``per_class`` samples.
    """
    rng = np.random.default_rng(seed)
    picked = []
    for c in range(int(labels.max()) + 1):
        idx = np.flatnonzero(labels == c)
        if len(idx) < per_class:
            raise ConfigError(f"data.dataset.init_args.per_class={per_class}: class {c} has only {len(idx)} samples;"
                              " lower per_class")
        picked.append(rng.choice(idx, per_class, replace=False))
    return np.sort(np.concatenate(picked))


class CIFAR10Subset(ImageDataset):
    """Real CIFAR-10 that runs on a CPU: a class-balanced training subset and the full 10,000-image test set.

    Offline first: ``path`` is the archive shipped beside this repository
    (``../shared/data/cifar10_subset.npz``: 1,000 training images per class chosen with
    ``numpy.random.default_rng(0)`` from JPEG copies of CIFAR-10, see its README). Where that file is absent (a
    user's own clone), the same recipe is applied to torchvision's CIFAR-10 download: ``per_class`` training images
    per class drawn with :func:`balanced_subset` (``seed``), and the full test set. Same recipe and sizes, not the
    same images (the archive's images were JPEG-recompressed and drawn from a differently ordered copy), so numbers
    differ slightly between the two sources; ``partition.json`` names which one was used.
    """

    name = "cifar10_subset"

    def __init__(self, path: str = "../shared/data/cifar10_subset.npz", root: str = "data", download: bool = True,
                 per_class: int = 1000, seed: int = 0) -> None:
        """Configure the loader.

        Args:
            path: the offline archive; used when it exists.
            root: torchvision data folder for the fallback (holds ``cifar-10-batches-py``).
            download: allow the fallback to download CIFAR-10 into ``root`` (needs network).
            per_class: training images per class in the fallback.
            seed: the fallback's draw.
        """
        self.path, self.root, self.download, self.per_class, self.seed = path, root, download, per_class, seed

    def load(self) -> ImageData:
        """Load the archive, else build the subset from torchvision's CIFAR-10; x is uint8 [N, 3, 32, 32].

        Raises:
            FileNotFoundError: neither the archive nor torchvision's copy is there, and downloading is off or fails.
        """
        if Path(self.path).is_file():
            data = NpzData(self.path).load()
            data.name = f"{self.name} ({Path(self.path).name})"
            return data
        import torchvision

        how = f"put {self.path} in place, or allow download: true (needs network) into {self.root}"
        tr, te = torchvision_pair(type(self).__name__, torchvision.datasets.CIFAR10, self.root,
                                   download=self.download, how=how, looked_at=[self.path, self.root])
        keep = balanced_subset(np.asarray(tr.targets), self.per_class, self.seed)
        return from_numpy(f"{self.name} (torchvision, {self.per_class} per class, seed {self.seed})",
                           tr.data[keep], np.asarray(tr.targets)[keep], te.data, te.targets, tr.classes,
                           channels_last=True, source=self.root)

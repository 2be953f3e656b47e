"""The data sets a library packages: Fashion-MNIST (Debian's package, else torchvision), scikit-learn's 8x8 digits,
and CIFAR-10, CIFAR-100 and EMNIST Balanced via torchvision."""

from __future__ import annotations

import gzip
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import torch

from cosmos_pl.errors import ConfigError

from .base import ImageData, ImageDataset, from_numpy, torchvision_pair

__all__ = ["FashionMNIST", "Digits", "CIFAR10", "CIFAR100", "EMNISTBalanced"]


class FashionMNIST(ImageDataset):
    """Fashion-MNIST (60000 train / 10000 test, 1x28x28, 10 classes)."""

    name = "fashion_mnist"
    # Debian package dataset-fashion-mnist installs the IDX files here.
    SYSTEM_DIR = "/usr/share/datasets/fashion-mnist"
    FILES = (
        "train-images-idx3-ubyte",
        "train-labels-idx1-ubyte",
        "t10k-images-idx3-ubyte",
        "t10k-labels-idx1-ubyte",
    )

    def __init__(self, root: str = "data", download: bool = True) -> None:
        """Configure the loader.

        Args:
            root: torchvision download folder, used when the Debian copy in
                ``/usr/share/datasets/fashion-mnist`` is absent.
            download: allow torchvision to download into ``root`` (needs network).
        """
        self.root = root
        self.download = download

    def _system_files(self) -> list[Path] | None:
        found = []
        for stem in self.FILES:
            cands = [Path(self.SYSTEM_DIR) / f"{stem}.gz", Path(self.SYSTEM_DIR) / stem]
            hit = next((p for p in cands if p.is_file()), None)
            if hit is None:
                return None
            found.append(hit)
        return found

    def _unpack(self, raw: Path) -> None:
        """Gunzip the four IDX .gz files in ``raw`` beside themselves (each written whole, then renamed). torchvision
        unpacks only the .gz files whose MD5 matches its own download; the same files compressed again (Debian's
        package, a mirror) would send it to the network, while it reads unpacked ones as they are.

        Raises:
            ValueError: a file that is not gzip data, naming it.
        """
        for stem in self.FILES:
            target = raw / stem
            if target.is_file():
                continue
            with tempfile.NamedTemporaryFile(dir=raw, prefix=f".{stem}.", delete=False) as dst:
                try:
                    with gzip.open(raw / f"{stem}.gz") as src:
                        shutil.copyfileobj(src, dst)
                except (OSError, EOFError) as err:
                    Path(dst.name).unlink()
                    raise ValueError(f"{raw / (stem + '.gz')}: not a complete gzip file ({err}); replace it with "
                                     f"Fashion-MNIST's {stem}.gz") from None
            os.replace(dst.name, target)

    def load(self) -> ImageData:
        """Load Fashion-MNIST; x is uint8 [N, 1, 28, 28]. Its ``name`` says where the images came from (the fit's
        set-up line and ``partition.json`` show it): Debian's package, torchvision's copy already in ``root``, or a
        download into ``root``.

        Raises:
            FileNotFoundError: neither the Debian folder nor ``root`` has the data and
                downloading is off or fails.
        """
        import torchvision
        from torchvision.datasets.mnist import read_image_file, read_label_file

        classes = list(torchvision.datasets.FashionMNIST.classes)
        files = self._system_files()
        if files is not None:
            # torchvision's IDX reader opens files uncompressed, so gunzip to a temp dir.
            with tempfile.TemporaryDirectory() as tmp:
                plain = []
                for f in files:
                    out = Path(tmp) / f.name.removesuffix(".gz")
                    with (gzip.open(f) if f.suffix == ".gz" else open(f, "rb")) as src, open(out, "wb") as dst:
                        shutil.copyfileobj(src, dst)
                    plain.append(str(out))
                xtr, ytr = read_image_file(plain[0]), read_label_file(plain[1])
                xte, yte = read_image_file(plain[2]), read_label_file(plain[3])
            return ImageData(f"{self.name} (Debian's dataset-fashion-mnist)", xtr.unsqueeze(1), ytr,
                             xte.unsqueeze(1), yte, classes, self.SYSTEM_DIR)

        folder = Path(self.root) / "FashionMNIST"
        present = [all((folder / "raw" / f"{stem}{ext}").is_file() for stem in self.FILES) for ext in ("", ".gz")]
        if present[1] and not present[0]:
            self._unpack(folder / "raw")
        how = (f"as root or with sudo: apt-get install dataset-fashion-mnist (Debian's package); without root: with "
               f"download: true and network access torchvision downloads it into {folder / 'raw'}, or put the four "
               f"IDX .gz files ({', '.join(f'{stem}.gz' for stem in self.FILES)}) there (read with download: true)")
        looked_at = [self.SYSTEM_DIR, self.root]
        tr, te = torchvision_pair("FashionMNIST", torchvision.datasets.FashionMNIST, self.root, download=self.download,
                                  how=how, looked_at=looked_at)
        got = "read from" if any(present) else "downloaded by torchvision into"
        return ImageData(f"{self.name} ({got} {folder})", tr.data.unsqueeze(1), tr.targets.long(),
                         te.data.unsqueeze(1), te.targets.long(), classes, self.root)


class Digits(ImageDataset):
    """scikit-learn's bundled 8x8 digits (1797 images, 10 classes); works offline."""

    name = "digits"

    def __init__(self, test_fraction: float = 0.25, split_seed: int = 0) -> None:
        """Configure the split.

        Args:
            test_fraction: fraction of the images held out as the test split, in (0, 1).
            split_seed: seed of the stratified train/test split.
        """
        if not 0 < test_fraction < 1:
            raise ConfigError(f"data.dataset.init_args.test_fraction={test_fraction}: must lie in (0, 1)")
        self.test_fraction = test_fraction
        self.split_seed = split_seed

    def load(self) -> ImageData:
        """Load the digits; x is uint8 [N, 1, 8, 8] with values 0..16 scaled to 0..255."""
        from sklearn.datasets import load_digits
        from sklearn.model_selection import train_test_split

        d = load_digits()
        x = np.round(d.images * 255.0 / 16.0).astype(np.uint8)  # 0..16 -> 0..255
        xtr, xte, ytr, yte = train_test_split(
            x, d.target, test_size=self.test_fraction, stratify=d.target, random_state=self.split_seed
        )
        return from_numpy(self.name, xtr, ytr, xte, yte, [str(k) for k in range(10)], channels_last=False,
                           source="sklearn.datasets.load_digits")


class CIFAR10(ImageDataset):
    """CIFAR-10 via torchvision (50000 train / 10000 test, 3x32x32, 10 classes)."""

    name = "cifar10"

    def __init__(self, root: str = "data", download: bool = True) -> None:
        """Configure the loader.

        Args:
            root: torchvision data folder (holds ``cifar-10-batches-py``).
            download: allow torchvision to download into ``root`` (needs network).
        """
        self.root = root
        self.download = download

    def _factory(self):
        import torchvision

        return torchvision.datasets.CIFAR10

    def load(self) -> ImageData:
        """Load both splits; x is uint8 [N, 3, 32, 32].

        Raises:
            FileNotFoundError: not in ``root`` and downloading is off or fails.
        """
        how = "put the torchvision copy under root, or use NpzData with ../shared/data/cifar10_subset.npz"
        tr, te = torchvision_pair(type(self).__name__, self._factory(), self.root, download=self.download, how=how)
        # torchvision keeps CIFAR as HWC uint8 numpy arrays.
        return from_numpy(self.name, tr.data, tr.targets, te.data, te.targets, tr.classes, channels_last=True,
                           source=self.root)


class CIFAR100(CIFAR10):
    """CIFAR-100 via torchvision (50000 train / 10000 test, 3x32x32, 100 classes)."""

    name = "cifar100"

    def __init__(self, root: str = "data", download: bool = True) -> None:
        """Configure the loader.

        Args:
            root: torchvision data folder (holds ``cifar-100-python``).
            download: allow torchvision to download into ``root`` (needs network).
        """
        super().__init__(root, download)

    def _factory(self):
        import torchvision

        return torchvision.datasets.CIFAR100


class EMNISTBalanced(ImageDataset):
    """EMNIST 'balanced' split via torchvision (112800 train / 18800 test, 1x28x28, 47 classes)."""

    name = "emnist_balanced"

    def __init__(self, root: str = "data", download: bool = True) -> None:
        """Configure the loader.

        Args:
            root: torchvision data folder (holds ``EMNIST/raw``).
            download: allow torchvision to download into ``root`` (needs network).
        """
        self.root = root
        self.download = download

    def load(self) -> ImageData:
        """Load both splits; x is uint8 [N, 1, 28, 28], upright.

        Raises:
            FileNotFoundError: not in ``root`` and downloading is off or fails.
        """
        import torchvision

        def make(root, train, download):
            return torchvision.datasets.EMNIST(root, split="balanced", train=train, download=download)

        tr, te = torchvision_pair("EMNIST", make, self.root, download=self.download,
                                  how="put the torchvision copy under root")
        def fix(x: torch.Tensor) -> torch.Tensor:
            # The raw EMNIST images are stored transposed; torchvision does not undo it.
            return x.transpose(-1, -2).unsqueeze(1).contiguous()

        return ImageData(self.name, fix(tr.data), tr.targets.long(), fix(te.data), te.targets.long(), list(tr.classes),
                         self.root)

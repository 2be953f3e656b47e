"""Image-classification data sets loaded fully into memory as uint8 tensors.

Each data set is a small class whose ``__init__`` takes typed keyword settings, so that
configs can choose it with ``class_path`` / ``init_args`` (jsonargparse). ``load()``
returns an :class:`ImageData`. A data set that cannot be found (no files, and download
off or failing offline) raises ``FileNotFoundError`` naming the paths looked at and how
to get the data. Every loaded :class:`ImageData` is checked on construction
(:func:`check_image_data`): a broken archive fails at load with a ``DataError`` naming the
data set, the file and the field, not minutes into training.
"""

from __future__ import annotations

import difflib
import gzip
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from cosmos_pl.errors import ConfigError, DataError

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


@dataclass
class ImageData:
    """A labelled image-classification data set held in memory as uint8 tensors.

    Every instance is checked on construction (:func:`check_image_data`), so every loader's ``load()``
    goes through the same checks before any partition or training.

    Attributes:
        name: short name of the data set.
        x_train: uint8 [N, C, H, W] training images.
        y_train: int64 [N] training labels (index into ``classes``).
        x_test: uint8 [N_test, C, H, W] test images.
        y_test: int64 [N_test] test labels.
        classes: class names; label k is ``classes[k]``.
        source: the file or folder the data came from (named in error messages), or "".

    Raises:
        DataError: see :func:`check_image_data`.
    """

    name: str
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    classes: list[str]
    source: str = ""

    def __post_init__(self) -> None:
        check_image_data(self)

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @property
    def in_chans(self) -> int:
        return int(self.x_train.shape[1])

    @property
    def image_size(self) -> int:
        """Image height H (use ``shape`` for non-square images)."""
        return int(self.x_train.shape[2])

    @property
    def shape(self) -> tuple[int, int]:
        """(H, W) of the images."""
        return int(self.x_train.shape[2]), int(self.x_train.shape[3])


def _where(name: str, source: str) -> str:
    return f"data set {name!r}" + (f" ({source})" if source else "")


def check_image_data(data: ImageData) -> None:
    """Check a loaded data set before anything is partitioned or trained.

    Both splits: images uint8 ``[N, C, H, W]`` with N >= 1 (no empty split), labels int64 ``[N]`` (as many
    as images) within ``0 .. len(classes) - 1``; the test images have the training images' C, H and W;
    ``classes`` is not empty.

    Raises:
        DataError: naming the data set, its file or folder, the field (``x_train``, ``y_test``,
            ``classes``, ...), what is wrong and the fix.
    """
    where = _where(data.name, data.source)
    m = len(data.classes)
    if m == 0:
        raise DataError(f"{where}: field classes is empty: list the class names (label k is classes[k])")
    for split in ("train", "test"):
        x, y = getattr(data, f"x_{split}"), getattr(data, f"y_{split}")
        if not isinstance(x, torch.Tensor) or x.dtype != torch.uint8 or x.dim() != 4:
            raise DataError(f"{where}: field x_{split} must be a uint8 tensor [N, C, H, W], got "
                            f"{getattr(x, 'dtype', type(x).__name__)} of shape {tuple(getattr(x, 'shape', ()))}")
        if not isinstance(y, torch.Tensor) or y.dtype != torch.int64 or y.dim() != 1:
            raise DataError(f"{where}: field y_{split} must be an int64 tensor [N] of class indices, got "
                            f"{getattr(y, 'dtype', type(y).__name__)} of shape {tuple(getattr(y, 'shape', ()))}")
        if len(x) != len(y):
            raise DataError(f"{where}: x_{split} holds {len(x)} images but y_{split} holds {len(y)} labels: "
                            "give one label per image")
        if len(y) == 0:
            raise DataError(f"{where}: the {split} split is empty (x_{split} has 0 images): "
                            f"the {split} split needs at least one image")
        if min(x.shape[1:]) < 1:
            raise DataError(f"{where}: field x_{split} has shape {tuple(x.shape)}: C, H and W must be >= 1")
        lo, hi = int(y.min()), int(y.max())
        if lo < 0 or hi >= m:
            bad = lo if lo < 0 else hi
            raise DataError(f"{where}: field y_{split} holds label {bad}, outside 0..{m - 1} of the {m} names in "
                            f"classes: labels index classes; fix the labels or list every class")
    if data.x_test.shape[1:] != data.x_train.shape[1:]:
        (c, h, w), (ct, ht, wt) = data.x_train.shape[1:], data.x_test.shape[1:]
        raise DataError(f"{where}: field x_test has images of C x H x W = {ct} x {ht} x {wt} but x_train has "
                        f"{c} x {h} x {w}: both splits need the same channel count and image size")


class ImageDataset:
    """Base class of the data sets selectable in configs."""

    name: str = "dataset"

    def load(self) -> ImageData:
        """Load both splits into memory; the result passes :func:`check_image_data` (ImageData checks itself).

        Raises:
            FileNotFoundError: the data set is not on disk and could not be downloaded.
            DataError: the files hold data that cannot be trained on (shapes, dtypes, labels, empty split).
        """
        raise NotImplementedError


def _missing(name: str, looked_at: list, how: str, cause: BaseException | None = None) -> FileNotFoundError:
    """Build the FileNotFoundError every loader raises for a missing data set."""
    paths = ", ".join(str(Path(p).expanduser().resolve()) for p in looked_at)
    msg = f"{name} data set not found; looked at: {paths}. To get it: {how}"
    if cause is not None:
        msg += f" (underlying error: {type(cause).__name__}: {cause})"
    return FileNotFoundError(msg)


def _from_numpy(name: str, x_train, y_train, x_test, y_test, classes, channels_last: bool,
                source: str = "") -> ImageData:
    """Convert [N,H,W] or [N,H,W,C] (channels_last) / [N,C,H,W] arrays to ImageData.

    Nothing is converted silently: images must be uint8 (or integers within 0..255), labels integers.

    Raises:
        DataError: float or out-of-range images, non-integer or non-1-D labels, a channels-first array
            given as channels-last, naming the data set, ``source`` and the field.
    """
    where = _where(name, source)

    def images(field: str, x) -> torch.Tensor:
        x = np.asarray(x)
        if x.ndim not in (3, 4):
            layout = "[N, H, W, C] or [N, H, W]" if channels_last else "[N, C, H, W] or [N, H, W]"
            raise DataError(f"{where}: field {field} has shape {x.shape}; images must be {layout}")
        if x.dtype != np.uint8:
            if not np.issubdtype(x.dtype, np.integer):
                raise DataError(f"{where}: field {field} has dtype {x.dtype}; images must be uint8 0..255: "
                                f"{_float_hint(x)}")
            if x.size and (x.min() < 0 or x.max() > 255):
                raise DataError(f"{where}: field {field} holds values {x.min()}..{x.max()}; images must lie "
                                "in 0..255 (uint8)")
        if x.ndim == 4 and channels_last and x.shape[-1] > 4 and x.shape[1] in (1, 3, 4):
            raise DataError(f"{where}: field {field} has shape {x.shape}, which looks channels-first "
                            f"[N, C, H, W]; this loader reads [N, H, W, C]: save x.transpose(0, 2, 3, 1)")
        x = torch.as_tensor(x.astype(np.uint8, copy=False))
        if x.ndim == 3:  # grayscale without a channel axis
            return x.unsqueeze(1).contiguous()
        return x.permute(0, 3, 1, 2).contiguous() if channels_last else x.contiguous()

    def labels(field: str, y) -> torch.Tensor:
        y = np.asarray(y)
        if y.ndim != 1:
            raise DataError(f"{where}: field {field} has shape {y.shape}; labels must be 1-D [N]")
        if y.size and not np.issubdtype(y.dtype, np.integer):
            raise DataError(f"{where}: field {field} has dtype {y.dtype}; labels must be integer class indices: "
                            "save them with .astype(np.int64)")
        return torch.as_tensor(y.astype(np.int64, copy=False))

    return ImageData(name, images("x_train", x_train), labels("y_train", y_train), images("x_test", x_test),
                     labels("y_test", y_test), [str(c) for c in classes], source)


def _float_hint(x: np.ndarray) -> str:
    """How to turn non-integer images into uint8, from the range their values lie in."""
    if not np.issubdtype(x.dtype, np.floating) or x.size == 0:
        return "save them as uint8 with values 0..255"
    lo, hi = float(np.nanmin(x)), float(np.nanmax(x))
    if not (np.isfinite(lo) and np.isfinite(hi)):
        return "they hold NaN or infinite values; fix them, then save them as uint8 0..255"
    if 0 <= lo and hi <= 1:
        return f"its values lie in [{lo:g}, {hi:g}], so convert with (x * 255).round().astype(np.uint8)"
    if 0 <= lo and hi <= 255:
        return f"its values already lie in [{lo:g}, {hi:g}], so convert with x.round().astype(np.uint8)"
    return (f"its values lie in [{lo:g}, {hi:g}], outside both [0, 1] and [0, 255] (normalized images?): undo the "
            "normalization, then save them as uint8 0..255")


def _torchvision_pair(name: str, make, root: str, download: bool, how: str, looked_at: list | None = None):
    """Build the train and test torchvision data sets, wrapping failures as FileNotFoundError."""
    try:
        return make(root=root, train=True, download=download), make(root=root, train=False, download=download)
    except Exception as e:  # missing files (RuntimeError) or offline download (URLError, ...)
        hint = how if download else f"set download: true (needs network), or {how}"
        raise _missing(name, looked_at or [root], hint, e) from e


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

    def load(self) -> ImageData:
        """Load Fashion-MNIST; x is uint8 [N, 1, 28, 28].

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
            return ImageData(self.name, xtr.unsqueeze(1), ytr, xte.unsqueeze(1), yte, classes, self.SYSTEM_DIR)

        how = "apt-get install dataset-fashion-mnist (offline Debian package)"
        looked_at = [self.SYSTEM_DIR, self.root]
        tr, te = _torchvision_pair("FashionMNIST", torchvision.datasets.FashionMNIST, self.root, self.download, how, looked_at)
        return ImageData(self.name, tr.data.unsqueeze(1), tr.targets.long(), te.data.unsqueeze(1), te.targets.long(), classes,
                         self.root)


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
        return _from_numpy(self.name, xtr, ytr, xte, yte, [str(k) for k in range(10)], channels_last=False,
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
        tr, te = _torchvision_pair(type(self).__name__, self._factory(), self.root, self.download, how)
        # torchvision keeps CIFAR as HWC uint8 numpy arrays.
        return _from_numpy(self.name, tr.data, tr.targets, te.data, te.targets, tr.classes, channels_last=True,
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

        tr, te = _torchvision_pair("EMNIST", make, self.root, self.download, "put the torchvision copy under root")
        def fix(x: torch.Tensor) -> torch.Tensor:
            # The raw EMNIST images are stored transposed; torchvision does not undo it.
            return x.transpose(-1, -2).unsqueeze(1).contiguous()

        return ImageData(self.name, fix(tr.data), tr.targets.long(), fix(te.data), te.targets.long(), list(tr.classes),
                         self.root)


def _decode_all(paths: list[str], image_size: int | None = None) -> torch.Tensor:
    """Decode image files to one uint8 [N, 3, H, W] tensor (RGB), resizing when asked.

    Raises:
        DataError: sizes differ and ``image_size`` is None.
    """
    from torchvision.io import ImageReadMode, decode_image
    from torchvision.transforms.v2.functional import resize

    out = []
    for p in paths:
        try:
            img = decode_image(p, mode=ImageReadMode.RGB)
        except (RuntimeError, OSError, ValueError) as err:  # torchvision names neither the file nor the format
            raise DataError(f"image file {p} cannot be decoded ({' '.join(str(err).split())[:200]}): replace it "
                            "with a readable JPEG or PNG, or remove it") from None
        if image_size is not None:
            img = resize(img, [image_size, image_size], antialias=True)
        elif out and img.shape != out[0].shape:
            raise DataError(
                f"images differ in size: {paths[0]} is {tuple(out[0].shape[1:])}, {p} is"
                f" {tuple(img.shape[1:])}; set image_size to resize them all"
            )
        out.append(img)
    if not out:
        return torch.zeros(0, 3, image_size or 1, image_size or 1, dtype=torch.uint8)
    return torch.stack(out)


class TinyImageNet(ImageDataset):
    """Tiny ImageNet (100000 train / 10000 val used as test, 3x64x64, 200 classes)."""

    name = "tiny_imagenet"
    URL = "http://cs231n.stanford.edu/tiny-imagenet-200.zip"

    def __init__(self, root: str = "data", download: bool = True) -> None:
        """Configure the loader.

        Args:
            root: folder that holds (or receives) ``tiny-imagenet-200/``.
            download: download and extract the zip into ``root`` when missing (needs network).
        """
        self.root = root
        self.download = download

    def load(self) -> ImageData:
        """Decode all images; x is uint8 [N, 3, 64, 64]; the val split is the test split.

        Raises:
            FileNotFoundError: ``root/tiny-imagenet-200`` is missing and downloading is
                off or fails.
        """
        from torchvision.datasets import ImageFolder
        from torchvision.datasets.utils import download_and_extract_archive

        base = Path(self.root) / "tiny-imagenet-200"
        ann = base / "val" / "val_annotations.txt"
        how = f"set download: true with network, or unpack {self.URL} into root"
        if not (base / "train").is_dir() or not ann.is_file():
            if not self.download:
                raise _missing("TinyImageNet", [base / "train", ann], how)
            try:
                download_and_extract_archive(self.URL, self.root)
            except Exception as e:
                raise _missing("TinyImageNet", [base], how, e) from e
        train = ImageFolder(str(base / "train"))  # train/<wnid>/images/*.JPEG
        val = []
        for line in ann.read_text().splitlines():
            fields = line.split("\t")
            if len(fields) >= 2:
                val.append((str(base / "val" / "images" / fields[0]), train.class_to_idx[fields[1]]))
        return ImageData(
            self.name,
            _decode_all([p for p, _ in train.samples]),
            torch.tensor(train.targets, dtype=torch.int64),
            _decode_all([p for p, _ in val]),
            torch.tensor([y for _, y in val], dtype=torch.int64),
            list(train.classes),
            str(base),
        )


def _check_class_folders(split: Path) -> None:
    """Every class folder of an ImageFolder split holds at least one image file (torchvision says "Found no
    valid file" without naming the folder, and an empty one would be a class without any sample).

    Raises:
        DataError: naming the empty class folders and the file types looked for.
    """
    from torchvision.datasets.folder import IMG_EXTENSIONS

    classes = [d for d in sorted(split.iterdir()) if d.is_dir()]
    empty = [d.name for d in classes
             if not any(f.is_file() and f.suffix.lower() in IMG_EXTENSIONS for f in d.rglob("*"))]
    if empty:
        raise DataError(f"{split}: class folder(s) {', '.join(empty)} hold no image file ({', '.join(IMG_EXTENSIONS)}): "
                        "add images to them, or remove the folders")


class ImageFolderData(ImageDataset):
    """Any folder with ``train/<class>/*`` and ``test/<class>/*`` image files."""

    name = "image_folder"

    def __init__(self, root: str, image_size: int | None = None) -> None:
        """Configure the loader.

        Args:
            root: folder holding ``train/`` and ``test/`` in torchvision ImageFolder
                layout (one subfolder per class).
            image_size: resize every image to image_size x image_size; when None all
                images must already share one size.
        """
        self.root = root
        self.image_size = image_size

    def load(self) -> ImageData:
        """Decode every image to RGB; x is uint8 [N, 3, H, W].

        Raises:
            FileNotFoundError: ``train/`` or ``test/`` is missing or holds no images.
            DataError: sizes differ and image_size is None, or test has unknown classes.
        """
        from torchvision.datasets import ImageFolder

        how = "create root/train/<class>/<image> and root/test/<class>/<image> (ImageFolder layout)"
        dirs = [Path(self.root) / "train", Path(self.root) / "test"]
        for d in dirs:
            if d.is_dir():
                _check_class_folders(d)
        try:
            train, test = (ImageFolder(str(d)) for d in dirs)
        except (FileNotFoundError, OSError) as e:
            raise _missing("ImageFolder", dirs, how, e) from e
        unknown = set(test.classes) - set(train.classes)
        if unknown:
            raise DataError(f"{Path(self.root) / 'test'} has classes missing from train/: {sorted(unknown)}: "
                            "add them to train/ or remove them from test/")
        # Index test labels by train's class order (test/ may lack some classes).
        y_test = [train.class_to_idx[test.classes[y]] for y in test.targets]
        paths = [p for p, _ in train.samples] + [p for p, _ in test.samples]
        x = _decode_all(paths, self.image_size)  # one pass so both splits share a size
        n = len(train.samples)
        return ImageData(
            Path(self.root).name or self.name,
            x[:n],
            torch.tensor(train.targets, dtype=torch.int64),
            x[n:],
            torch.tensor(y_test, dtype=torch.int64),
            list(train.classes),
            str(self.root),
        )


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
            DataError: a required array is missing, or the arrays fail :func:`check_image_data` (shapes,
                dtypes, label range), naming the file and the array.
        """
        if not Path(self.path).is_file():
            raise _missing("npz", [self.path], "pass path: to an .npz with x_train, y_train, x_test, y_test, classes")
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
            return _from_numpy(Path(self.path).stem, arrays["x_train"], ytr, arrays["x_test"], yte, classes,
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
        tr, te = _torchvision_pair(type(self).__name__, torchvision.datasets.CIFAR10, self.root, self.download, how,
                                   looked_at=[self.path, self.root])
        keep = balanced_subset(np.asarray(tr.targets), self.per_class, self.seed)
        return _from_numpy(f"{self.name} (torchvision, {self.per_class} per class, seed {self.seed})",
                           tr.data[keep], np.asarray(tr.targets)[keep], te.data, te.targets, tr.classes,
                           channels_last=True, source=self.root)


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

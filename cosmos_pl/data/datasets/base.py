"""What every data set is and shares: :class:`ImageData` (both splits in memory as uint8 tensors) and its checks,
:class:`ImageDataset` (the base class configs choose from), and the loaders' common steps: arrays to
:class:`ImageData` (:func:`from_numpy`), torchvision's train and test sets (:func:`torchvision_pair`) and the
``FileNotFoundError`` of a data set that is not there (:func:`data_not_found`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from cosmos_pl.data.guard import check_client_data_allowed
from cosmos_pl.errors import DataError

__all__ = ["ImageData", "check_image_data", "check_tested_classes", "ImageDataset", "data_not_found", "from_numpy",
           "torchvision_pair"]


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
        check_client_data_allowed(f"the data set {self.name!r}")
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


def check_tested_classes(name: str, source: str, classes: list[str], train_counts: np.ndarray,
                         test_counts: np.ndarray, fix: str) -> None:
    """Every class with training samples has test samples.

    Each client's test set is drawn from the test split in proportion to the client's training classes
    (:func:`~cosmos_pl.data.build_federation`); a class without test samples would silently leave its clients smaller
    test sets that never score it, so personalized accuracy would mean something else for them.

    Args:
        name: the data set's name (named in the error).
        source: its file or folder (named in the error), or "".
        classes: the class names [M].
        train_counts: int [M], training samples per class (of the samples that reach clients).
        test_counts: int [M], test samples per class.
        fix: what the user can do, ending the message.

    Raises:
        DataError: naming the classes without test samples (at most 10, then a count), their training and test
            counts, and ``fix``.
    """
    untested = [k for k in range(len(classes)) if train_counts[k] > 0 and test_counts[k] == 0]
    if not untested:
        return
    listed = ", ".join(f"{classes[k]!r} ({int(train_counts[k])} training, 0 test)" for k in untested[:10])
    if len(untested) > 10:
        listed += f", and {len(untested) - 10} more"
    raise DataError(f"{_where(name, source)}: {len(untested)} class(es) with training samples have no test samples: "
                    f"{listed}. Each client's test set is drawn in proportion to its own training classes, so a "
                    f"client holding these would be scored on fewer test samples and never on them: {fix}")


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


def data_not_found(name: str, looked_at: list, how: str, cause: BaseException | None = None) -> FileNotFoundError:
    """Build the FileNotFoundError every loader raises for a missing data set."""
    paths = ", ".join(str(Path(p).expanduser().resolve()) for p in looked_at)
    msg = f"{name} data set not found; looked at: {paths}. To get it: {how}"
    if cause is not None:
        msg += f" (underlying error: {type(cause).__name__}: {cause})"
    return FileNotFoundError(msg)


def from_numpy(name: str, x_train, y_train, x_test, y_test, classes, *, channels_last: bool,
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


def torchvision_pair(name: str, make, root: str, *, download: bool, how: str, looked_at: list | None = None):
    """Build the train and test torchvision data sets, wrapping failures as FileNotFoundError."""
    try:
        return make(root=root, train=True, download=download), make(root=root, train=False, download=download)
    except Exception as e:  # missing files (RuntimeError) or offline download (URLError, ...)
        hint = how if download else f"set download: true (needs network), or {how}"
        raise data_not_found(name, looked_at or [root], hint, e) from e

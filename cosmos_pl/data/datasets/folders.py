"""The data sets read from image files: :class:`ImageFolderData` (any ``train/<class>/*`` and ``test/<class>/*``
tree) and :class:`TinyImageNet`, and the steps they share: :func:`check_class_folders` and :func:`decode_images`.

The files read are those with torchvision's ImageFolder suffixes (:data:`IMAGE_SUFFIXES`, any case); every one of them
is decoded: JPEG, PNG and WebP by torchvision's ``decode_image``, BMP, TIFF, PPM and PGM by Pillow. All become uint8
RGB ``[3, H, W]`` alike: grayscale and palette images are spread to three equal channels, an alpha channel is dropped
(not blended), and 16-bit samples keep their high byte (value >> 8, as torchvision's ``to_dtype(..., scale=True)``).
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import numpy as np
import torch

from cosmos_pl.errors import DataError

from .base import ImageData, ImageDataset, check_tested_classes, data_not_found

__all__ = ["ImageFolderData", "TinyImageNet", "check_class_folders", "decode_images", "IMAGE_SUFFIXES"]

#: The file suffixes read as images (torchvision's ``IMG_EXTENSIONS``, which ImageFolder lists); other files are
#: skipped.
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
# decoded by torchvision.io.decode_image; the other IMAGE_SUFFIXES by Pillow, which reads them all
_TORCHVISION_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp")
# undecodable files named in full in the error (the others are counted)
_NAMED_UNDECODABLE = 5
_FORMATS = "JPEG, PNG, WebP, BMP, TIFF, PPM or PGM, 8 or 16 bits per sample"


def _reason(err: BaseException, path: str) -> str:
    """A decoder's message as one short clause: without torch's C++ trace, torchvision's ``<function>, <source
    file>:<line>,`` prefix or Pillow's repetition of the file name, and cut after whole sentences (at most about
    100 characters; a longer first sentence is cut at a word)."""
    text = str(err).split("Exception raised from")[0]
    text = re.sub(r"^[^,\n]*, \S+\.(?:cpp|cc|c|h|hpp):\d+, ", "", text.strip())
    text = re.sub(r"\S+\.(?:cpp|cc|c|h|hpp):\d+,? ?", "", text)
    text = " ".join(text.replace(repr(path), "").replace(path, "").split()).strip(" .,:")
    text = text or type(err).__name__
    sentences = re.split(r"(?<=\.) ", text)
    kept = sentences[0]
    for sentence in sentences[1:]:
        if len(kept) + 1 + len(sentence) > 100:
            break
        kept += " " + sentence
    kept = kept.rstrip(".")
    if len(kept) > 150:
        kept = kept[:151].rsplit(" ", 1)[0].rstrip(" .,:;") + " ..."
    return kept


def _decode_with_pillow(path: str) -> torch.Tensor:
    """One BMP, TIFF, PPM or PGM file (any format Pillow reads; a multi-page TIFF's first page) as uint8
    ``[3, H, W]``; 16-bit grayscale keeps its high byte (16-bit RGB: Pillow keeps it on reading).

    Raises:
        ValueError: the file holds 32-bit integer or float pixels (Pillow modes I and F), which have no 8-bit scale.
        Exception: whatever Pillow raises for a file it cannot read.
    """
    from PIL import Image

    with warnings.catch_warnings():  # a corrupt EXIF block, a palette's transparency: the pixels are still read
        warnings.simplefilter("ignore")
        with Image.open(path) as im:
            im.load()
            if im.mode in ("I;16", "I;16L", "I;16B", "I;16N"):
                gray = (np.asarray(im).astype(np.uint16) >> 8).astype(np.uint8)
                pixels = np.repeat(gray[..., None], 3, axis=2)
            elif im.mode in ("I", "F") or im.mode.startswith("I;"):
                kind = "float" if im.mode == "F" else "integer"
                raise ValueError(f"32-bit {kind} pixels (Pillow mode {im.mode}) have no 8-bit scale: save it with "
                                 "8 or 16 bits per sample")
            else:
                pixels = np.asarray(im.convert("RGB"))
    return torch.from_numpy(pixels.copy()).permute(2, 0, 1).contiguous()


def _decode(path: str) -> torch.Tensor | str:
    """One image file as uint8 RGB ``[3, H, W]``, or why it cannot be decoded (see :func:`_reason`)."""
    from torchvision.io import ImageReadMode, decode_image

    try:
        if Path(path).suffix.lower() in _TORCHVISION_SUFFIXES:
            img = decode_image(path, mode=ImageReadMode.RGB)  # 16-bit PNG: uint16
        else:
            img = _decode_with_pillow(path)
    except Exception as err:  # decoders raise RuntimeError, OSError, ValueError, SyntaxError, EOFError, ...
        return _reason(err, str(path))
    return img if img.dtype == torch.uint8 else (img.to(torch.int32) >> 8).to(torch.uint8)  # 16-bit: high byte


def _undecodable_error(bad: list[tuple[str, str]], total: int) -> DataError:
    """One error for every undecodable file: the count, the first few paths in full with their reasons."""
    if len(bad) == 1:
        path, reason = bad[0]
        return DataError(f"image file {path} cannot be decoded ({reason}): replace it with a readable image "
                         f"({_FORMATS}), or remove it")
    named = "; ".join(f"{p} ({r})" for p, r in bad[:_NAMED_UNDECODABLE])
    more = f"; and {len(bad) - _NAMED_UNDECODABLE} more" if len(bad) > _NAMED_UNDECODABLE else ""
    return DataError(f"{len(bad)} of the {total} image files cannot be decoded: {named}{more}. Replace them with "
                     f"readable images ({_FORMATS}), or remove them")


def decode_images(paths: list[str], image_size: int | None = None) -> torch.Tensor:
    """Decode image files to one uint8 [N, 3, H, W] tensor (RGB; see the module's docstring for the formats and
    how channels and bit depths are converted), resizing when asked.

    Every file is decoded before any error about undecodable files is raised, so one error names them all.

    Args:
        paths: the image files, in the order of the result's rows.
        image_size: resize every image to image_size x image_size (antialiased); None: all must share one size.

    Raises:
        DataError: files that cannot be decoded (their count, the first five with the decoder's reason), or
            sizes that differ while ``image_size`` is None (raised at the first image of another size).
    """
    from torchvision.transforms.v2.functional import resize

    out, bad, first = [], [], None
    for p in paths:
        img = _decode(p)
        if isinstance(img, str):
            bad.append((str(p), img))
            continue
        if image_size is not None:
            img = resize(img, [image_size, image_size], antialias=True)
        elif out and img.shape != out[0].shape:
            raise DataError(
                f"images differ in size: {first} is {tuple(out[0].shape[1:])}, {p} is"
                f" {tuple(img.shape[1:])}; set image_size to resize them all"
            )
        first = first or p
        out.append(img)
    if bad:
        raise _undecodable_error(bad, len(paths))
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
                raise data_not_found("TinyImageNet", [base / "train", ann], how)
            try:
                download_and_extract_archive(self.URL, self.root)
            except Exception as e:
                raise data_not_found("TinyImageNet", [base], how, e) from e
        train = ImageFolder(str(base / "train"))  # train/<wnid>/images/*.JPEG
        val = []
        for line in ann.read_text().splitlines():
            fields = line.split("\t")
            if len(fields) >= 2:
                val.append((str(base / "val" / "images" / fields[0]), train.class_to_idx[fields[1]]))
        x = decode_images([p for p, _ in train.samples] + [p for p, _ in val])  # one pass: one error names them all
        n = len(train.samples)
        return ImageData(
            self.name,
            x[:n],
            torch.tensor(train.targets, dtype=torch.int64),
            x[n:],
            torch.tensor([y for _, y in val], dtype=torch.int64),
            list(train.classes),
            str(base),
        )


def check_class_folders(split: Path) -> None:
    """Every class folder of an ImageFolder split holds at least one image file (torchvision says "Found no
    valid file" without naming the folder, and an empty one would be a class without any sample).

    Raises:
        DataError: naming the empty class folders and the file types looked for.
    """
    classes = [d for d in sorted(split.iterdir()) if d.is_dir()]
    empty = [d.name for d in classes
             if not any(f.is_file() and f.suffix.lower() in IMAGE_SUFFIXES for f in d.rglob("*"))]
    if empty:
        raise DataError(f"{split}: class folder(s) {', '.join(empty)} hold no image file "
                        f"({', '.join(IMAGE_SUFFIXES)}): add images to them, or remove the folders")


class ImageFolderData(ImageDataset):
    """Any folder with ``train/<class>/*`` and ``test/<class>/*`` image files (torchvision's ImageFolder layout).

    A class is a subfolder of ``train/``; its name is the class name and the classes are numbered in sorted order.
    ``test/`` holds the same class folders: every class with training images needs test images (each client's test
    set is drawn from ``test/`` in proportion to the client's own training classes), and a class only in ``test/``
    is refused. Images may lie in subfolders of a class folder. See the module's docstring for the file types read.
    """

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

        The folders are checked before any image is decoded (empty class folders, classes of one split only).

        Raises:
            FileNotFoundError: ``train/`` or ``test/`` is missing or holds no images.
            DataError: an empty class folder, a class in ``test/`` only, a class with training images but none in
                ``test/`` (naming the classes, their image counts and the fix), files that cannot be decoded (all
                found in one pass), or sizes that differ while image_size is None.
        """
        from torchvision.datasets import ImageFolder

        root = Path(self.root)
        how = "create root/train/<class>/<image> and root/test/<class>/<image> (ImageFolder layout)"
        dirs = [root / "train", root / "test"]
        for d in dirs:
            if d.is_dir():
                check_class_folders(d)
        try:
            train, test = (ImageFolder(str(d)) for d in dirs)
        except (FileNotFoundError, OSError) as e:
            raise data_not_found("ImageFolder", dirs, how, e) from e
        unknown = set(test.classes) - set(train.classes)
        if unknown:
            raise DataError(f"{root / 'test'} has classes missing from train/: {sorted(unknown)}: "
                            "add them to train/ or remove them from test/")
        # Index test labels by train's class order (test/ may lack classes: check_tested_classes names them).
        y_test = [train.class_to_idx[test.classes[y]] for y in test.targets]
        m = len(train.classes)
        check_tested_classes(root.name or self.name, str(self.root), train.classes,
                             np.bincount(train.targets, minlength=m), np.bincount(y_test, minlength=m),
                             f"add images of each to {root / 'test'}/<class>/, or move its folder out of "
                             f"{root / 'train'}")
        paths = [p for p, _ in train.samples] + [p for p, _ in test.samples]
        x = decode_images(paths, self.image_size)  # one pass so both splits share a size
        n = len(train.samples)
        return ImageData(
            root.name or self.name,
            x[:n],
            torch.tensor(train.targets, dtype=torch.int64),
            x[n:],
            torch.tensor(y_test, dtype=torch.int64),
            list(train.classes),
            str(self.root),
        )

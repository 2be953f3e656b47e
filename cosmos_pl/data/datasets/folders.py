"""The data sets read from image files: :class:`ImageFolderData` (any ``train/<class>/*`` and ``test/<class>/*``
tree) and :class:`TinyImageNet`, and the two steps they share: :func:`check_class_folders` and
:func:`decode_images`."""

from __future__ import annotations

from pathlib import Path

import torch

from cosmos_pl.errors import DataError

from .base import ImageData, ImageDataset, data_not_found

__all__ = ["ImageFolderData", "TinyImageNet", "check_class_folders", "decode_images"]


def decode_images(paths: list[str], image_size: int | None = None) -> torch.Tensor:
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
        return ImageData(
            self.name,
            decode_images([p for p, _ in train.samples]),
            torch.tensor(train.targets, dtype=torch.int64),
            decode_images([p for p, _ in val]),
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
                check_class_folders(d)
        try:
            train, test = (ImageFolder(str(d)) for d in dirs)
        except (FileNotFoundError, OSError) as e:
            raise data_not_found("ImageFolder", dirs, how, e) from e
        unknown = set(test.classes) - set(train.classes)
        if unknown:
            raise DataError(f"{Path(self.root) / 'test'} has classes missing from train/: {sorted(unknown)}: "
                            "add them to train/ or remove them from test/")
        # Index test labels by train's class order (test/ may lack some classes).
        y_test = [train.class_to_idx[test.classes[y]] for y in test.targets]
        paths = [p for p, _ in train.samples] + [p for p, _ in test.samples]
        x = decode_images(paths, self.image_size)  # one pass so both splits share a size
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

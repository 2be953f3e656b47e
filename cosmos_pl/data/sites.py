"""A federation as folders: each client's own data in its own folder, and U apart, so that a simulated federation
becomes a deployment (each site reads only its folder) and a simulation over the same folders gives its numbers.

Layout, as :func:`export_federation` writes it (``cosmos-pl export-partition --config X --out DIR``):

- ``DIR/public.npz``: ``x_public`` uint8 ``[n, C, H, W]`` (U: inputs only) and ``classes`` (the run's class list);
- ``DIR/client_<i>/data.npz``: ``x_train`` uint8 ``[n_i, C, H, W]`` and ``y_train`` (the client's whole partition;
  its validation split is carved where it is used, seeded from (seed, client) as in
  :func:`~cosmos_pl.data.federation.build_federation`), ``x_test``, ``y_test`` (its test set) and ``classes``
  (its labels are indices into these names, which may be a subset, in any order, of the run's);
- ``DIR/partition.json``: the simulation's partition (true groups, class counts), for reports only.

A site's folder may instead hold an ImageFolder tree (``train/<class>/<image>``, ``test/<class>/<image>``).
:func:`load_site` reads either and maps its labels to the run's classes by name.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch

from cosmos_pl.errors import DataError

from .datasets import ImageDataset
from .datasets.folders import check_class_folders, decode_images
from .guard import check_client_data_allowed
from .federation import VALIDATION_STREAM, ClientData, Federation, validation_split
from .partition import Partition

__all__ = ["export_federation", "load_site", "load_public", "client_folders", "SiteFolders"]


def _save_npz(path: Path, **arrays: Any) -> None:
    """``numpy.savez`` to ``path`` atomically (temporary file, fsync, rename)."""
    from cosmos_pl.files import atomic_write

    atomic_write(path, lambda f: np.savez(f, **arrays))


def export_federation(federation: Federation, out: Path) -> list[Path]:
    """Write ``federation`` (built without a validation split: the partitions whole) as the layout above; returns
    the client folders. Nothing of a client is in another's folder or in ``public.npz``."""
    out.mkdir(parents=True, exist_ok=True)
    classes = np.array(federation.classes)
    _save_npz(out / "public.npz", x_public=federation.public.numpy(), classes=classes)
    folders = []
    for i, c in enumerate(federation.clients):
        folder = out / f"client_{i}"
        folder.mkdir(exist_ok=True)
        _save_npz(folder / "data.npz", x_train=c.x.numpy(), y_train=c.y.numpy(), x_test=c.x_test.numpy(),
                  y_test=c.y_test.numpy(), classes=classes)
        folders.append(folder)
    partition = federation.partition.to_json(federation.partition_labels, federation.num_classes)
    (out / "partition.json").write_text(json.dumps(partition, indent=2) + "\n")
    return folders


def load_public(path: str | Path) -> tuple[torch.Tensor, list[str]]:
    """U ``[n, C, H, W]`` uint8 and the class list from a ``public.npz``.

    Raises:
        FileNotFoundError / DataError: no such file, or not U's layout (naming the file and what is wrong).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"the public set U {path} does not exist: give the public.npz that cosmos-pl "
                                "export-partition wrote (x_public uint8 [n, C, H, W] and classes)")
    with np.load(path) as z:
        if "x_public" not in z.files or "classes" not in z.files:
            raise DataError(f"{path}: needs arrays x_public (uint8 [n, C, H, W]) and classes; it has {z.files}")
        x, classes = z["x_public"], [str(c) for c in z["classes"]]
    if x.dtype != np.uint8 or x.ndim != 4:
        raise DataError(f"{path}: x_public must be uint8 [n, C, H, W], got {x.dtype} of shape {x.shape}")
    return torch.from_numpy(x.copy()), classes


def _read(folder: Path) -> tuple[torch.Tensor, np.ndarray, torch.Tensor, np.ndarray, list[str]]:
    """A site's ``(x_train, train class names, x_test, test class names)`` as stored, from ``data.npz`` or an
    ImageFolder tree."""
    npz = folder if folder.suffix == ".npz" else folder / "data.npz"
    if npz.is_file():
        with np.load(npz) as z:
            missing = [k for k in ("x_train", "y_train", "x_test", "y_test", "classes") if k not in z.files]
            if missing:
                raise DataError(f"{npz}: lacks arrays {missing}; it has {z.files}")
            names = np.array([str(c) for c in z["classes"]])
            for key in ("y_train", "y_test"):
                y = z[key]
                if y.size and (not np.issubdtype(y.dtype, np.integer) or y.min() < 0 or y.max() >= len(names)):
                    raise DataError(f"{npz}: {key} must hold class indices into its classes (0..{len(names) - 1})")
            return (torch.from_numpy(z["x_train"].copy()), names[z["y_train"]], torch.from_numpy(z["x_test"].copy()),
                    names[z["y_test"]])
    if (folder / "train").is_dir() and (folder / "test").is_dir():
        from torchvision.datasets import ImageFolder

        trees = []
        for split in ("train", "test"):
            check_class_folders(folder / split)
            trees.append(ImageFolder(str(folder / split)))
        x = decode_images([p for tree in trees for p, _ in tree.samples])  # one pass: one error names them all
        n = len(trees[0].samples)
        train_names, test_names = (np.array([tree.classes[y] for y in tree.targets]) for tree in trees)
        return x[:n], train_names, x[n:], test_names
    raise FileNotFoundError(f"{folder}: holds neither data.npz nor train/ and test/ folders: give the folder "
                            "cosmos-pl export-partition wrote for this site, or an ImageFolder tree")


def load_site(folder: str | Path, classes: list[str], image_shape: tuple[int, int, int], validation_fraction: float,
              seed: int, client_id: int) -> ClientData:
    """One site's data for a run: its labels mapped to the run's ``classes`` by name, its images checked against
    the run's ``[C, H, W]`` (U's), its validation split carved as in ``build_federation``.

    Raises:
        DataError: a class the run does not know, images of another shape or channel count, an image that cannot
            be decoded, labels that are not class indices; each names the file or class and the fix.
        FileNotFoundError: the folder holds no site data.
    """
    check_client_data_allowed(f"site {folder}'s data")
    folder = Path(folder)
    x, names, x_test, test_names = _read(folder)
    index = {name: k for k, name in enumerate(classes)}
    unknown = sorted(set(names.tolist()) - set(index) | set(test_names.tolist()) - set(index))
    if unknown:
        raise DataError(f"{folder}: class {unknown[0]!r} is not one of the run's {len(classes)} classes "
                        f"({', '.join(classes[:10])}{', ...' if len(classes) > 10 else ''}): rename its folder or "
                        "label to one of them, or leave its images out")
    for split, images in (("train", x), ("test", x_test)):
        if images.dtype != torch.uint8 or images.dim() != 4 or tuple(images.shape[1:]) != tuple(image_shape):
            shape = tuple(images.shape[1:]) if images.dim() == 4 else tuple(images.shape)
            raise DataError(f"{folder}: its {split} images are {images.dtype} of C x H x W {shape}, the run's are "
                            f"uint8 {tuple(image_shape)} (those of U): resize or convert them to that")
    y = torch.tensor([index[n] for n in names.tolist()], dtype=torch.int64)
    y_test = torch.tensor([index[n] for n in test_names.tolist()], dtype=torch.int64)
    counts = np.bincount(y.numpy(), minlength=len(classes))
    x_val = y_val = None
    if validation_fraction > 0:
        train_pos, val_pos = validation_split(y.numpy(), validation_fraction, len(classes),
                                              np.random.default_rng((seed, client_id, VALIDATION_STREAM)))
        x_val, y_val = x[torch.from_numpy(val_pos)], y[torch.from_numpy(val_pos)]
        x, y = x[torch.from_numpy(train_pos)], y[torch.from_numpy(train_pos)]
    return ClientData(x=x, y=y, x_test=x_test, y_test=y_test, class_counts=counts, x_val=x_val, y_val=y_val)


def _span(names: list[str]) -> str:
    """``client_3`` or ``client_3, client_5`` (at most 10 named, then a count)."""
    return ", ".join(names[:10]) + (f" and {len(names) - 10} more" if len(names) > 10 else "")


def client_folders(root: Path, num_clients: int) -> list[Path]:
    """The client folders of an export, ``root/client_0`` .. ``root/client_<num_clients - 1>``, in client order.

    Raises:
        ConfigError: a client folder is missing (naming it and the folders expected), or there are folders of
            clients beyond ``num_clients`` (naming them and the ``data.num_clients`` that reads them all).
    """
    from cosmos_pl.errors import ConfigError

    found = {int(p.name[len("client_"):]): p for p in root.glob("client_*")
             if p.is_dir() and p.name[len("client_"):].isdigit()}
    expected = f"expected client_0 .. client_{num_clients - 1} for data.num_clients={num_clients}"
    missing = [f"client_{i}" for i in range(num_clients) if i not in found]
    if missing:
        there = f"; it holds {_span([f'client_{i}' for i in sorted(found)])}" if found else ""
        raise ConfigError(f"{root}: {_span(missing)} {'is' if len(missing) == 1 else 'are'} missing ({expected}"
                          f"{there}): put the missing folder(s) back, or export the federation again into a new "
                          "folder (cosmos-pl export-partition --out DIR)")
    extra = sorted(i for i in found if i >= num_clients)
    if extra:
        raise ConfigError(f"data.num_clients={num_clients}: {root} also holds {_span([f'client_{i}' for i in extra])}"
                          f" ({expected}): give data.num_clients {max(found) + 1} to read every client folder, or "
                          "move the others out")
    return [found[i] for i in range(num_clients)]


class SiteFolders(ImageDataset):
    """The federation an export wrote (``cosmos-pl export-partition``), read as a simulation: U from
    ``public.npz``, client i from ``client_<i>/`` (data.npz or an ImageFolder tree). The partition is the folders';
    ``data.partitioner`` and ``data.public_fraction`` are not used, the folders must be ``client_0`` ..
    ``client_<data.num_clients - 1>`` (:func:`client_folders`) and ``data.validation_fraction`` is carved from each
    client's data as it would be on its site."""

    name = "site_folders"

    def __init__(self, root: str) -> None:
        """Configure the loader.

        Args:
            root: the folder ``cosmos-pl export-partition --out`` wrote.
        """
        self.root = root

    def federation(self, num_clients: int, validation_fraction: float, seed: int) -> Federation:
        """The federation of the folders.

        Raises:
            ConfigError: client folders other than ``client_0`` .. ``client_<num_clients - 1>`` (see
                :func:`client_folders`).
            DataError: see :func:`load_public` and :func:`load_site`.
            FileNotFoundError: see :func:`load_public` and :func:`load_site`.
        """
        root = Path(self.root)
        public, classes = load_public(root / "public.npz")
        folders = client_folders(root, num_clients)
        shape = tuple(public.shape[1:])
        clients = [load_site(f, classes, shape, validation_fraction, seed, i) for i, f in enumerate(folders)]
        meta = root / "partition.json"
        groups: Optional[np.ndarray] = None
        class_groups = None
        if meta.is_file():  # the simulation's partition, for reports only (no algorithm reads it)
            saved = json.loads(meta.read_text())
            groups = None if saved.get("groups") is None else np.array(saved["groups"])
            class_groups = saved.get("class_groups")
        sizes = np.cumsum([0] + [len(c.y) + (0 if c.y_val is None else len(c.y_val)) for c in clients])
        labels = np.concatenate([np.concatenate([c.y.numpy(), np.zeros(0, np.int64) if c.y_val is None else
                                                 c.y_val.numpy()]) for c in clients])
        partition = Partition([np.arange(sizes[i], sizes[i + 1]) for i in range(len(clients))], groups=groups,
                              class_groups=class_groups)
        return Federation(public=public, clients=clients, partition=partition, partition_labels=labels,
                          num_classes=len(classes), classes=classes, in_chans=int(public.shape[1]),
                          image_shape=(int(public.shape[2]), int(public.shape[3])))

    def load(self):  # pragma: no cover - DataConfig.build reads the folders through federation()
        raise NotImplementedError("SiteFolders is a whole federation: DataConfig.build reads it with federation()")

"""Data sets and the federation builder (offline): U holds no labels, a seed gives the same federation, and each
client's test set follows its own training label distribution."""

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch

from cosmos_pl.data import (
    CIFAR10,
    DATASETS,
    Digits,
    FashionMNIST,
    GroupDirichlet,
    ImageData,
    ImageFolderData,
    NpzData,
    Partition,
    Partitioner,
    TinyImageNet,
    build_federation,
    get_dataset,
)

SHARED_NPZ = Path(__file__).resolve().parents[2] / "shared" / "data" / "cifar10_subset.npz"
FASHION_DIR = Path(FashionMNIST.SYSTEM_DIR)
# Debian's dataset-fashion-mnist: all four files, as the loader needs them (an empty folder is not the package)
HAVE_DEBIAN_FASHION = FashionMNIST()._system_files() is not None


# --------------------------------------------------------------------------- loaders


def test_digits_shapes_and_values():
    d = Digits().load()
    # 1797 images; stratified 25% test split -> 450 test, 1347 train.
    assert d.x_train.shape == (1347, 1, 8, 8) and d.x_test.shape == (450, 1, 8, 8)
    assert d.x_train.dtype == torch.uint8 and d.y_train.dtype == torch.int64
    assert d.num_classes == 10 and d.in_chans == 1 and d.image_size == 8 and d.shape == (8, 8)
    # values 0..16 scaled by 255/16 and rounded: only these 17 levels occur
    levels = set(np.round(np.arange(17) * 255 / 16).astype(int).tolist())
    assert set(torch.unique(d.x_train).tolist()) <= levels
    assert d.x_train.min() == 0 and d.x_train.max() == 255
    # stratified: each class's test share is within one sample of 25% of that class
    per_class = torch.bincount(torch.cat([d.y_train, d.y_test]))
    assert torch.all((torch.bincount(d.y_test) - 0.25 * per_class).abs() <= 1)
    again = Digits().load()
    assert torch.equal(d.x_test, again.x_test) and torch.equal(d.y_train, again.y_train)


@pytest.mark.skipif(not HAVE_DEBIAN_FASHION,
                    reason=f"Debian's Fashion-MNIST files are not in {FASHION_DIR} (as root: apt-get install "
                           "dataset-fashion-mnist)")
def test_fashion_mnist_from_debian_folder():
    d = FashionMNIST(root="/nonexistent", download=False).load()
    assert d.name == "fashion_mnist (Debian's dataset-fashion-mnist)" and d.source == str(FASHION_DIR)
    assert d.x_train.shape == (60000, 1, 28, 28) and d.x_test.shape == (10000, 1, 28, 28)
    assert d.x_train.dtype == torch.uint8 and d.y_test.dtype == torch.int64
    assert torch.bincount(d.y_train).tolist() == [6000] * 10
    assert d.classes[0] == "T-shirt/top" and d.num_classes == 10


def _write_idx(folder: Path, gz: bool) -> None:
    """The four Fashion-MNIST IDX files, tiny (3 train and 2 test images of 28x28, labels 0..2), as Debian's package
    (``.gz``) or torchvision's raw/ folder (unpacked) holds them."""
    import gzip

    folder.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", 3), ("t10k", 2)):
        images = np.arange(n * 28 * 28, dtype=np.uint32).astype(np.uint8).tobytes()
        files = {f"{split}-images-idx3-ubyte": np.array([2051, n, 28, 28], ">i4").tobytes() + images,
                 f"{split}-labels-idx1-ubyte": np.array([2049, n], ">i4").tobytes() + bytes(range(n))}
        for stem, raw in files.items():
            if gz:
                (folder / f"{stem}.gz").write_bytes(gzip.compress(raw))
            else:
                (folder / stem).write_bytes(raw)


def test_fashion_mnist_says_where_its_images_came_from(tmp_path, monkeypatch):
    """Debian's package first; else torchvision's copy in root (read), else torchvision's download into root."""
    import torchvision

    debian = tmp_path / "debian"
    _write_idx(debian, gz=True)
    monkeypatch.setattr(FashionMNIST, "SYSTEM_DIR", str(debian))
    d = FashionMNIST(root=str(tmp_path / "unused"), download=False).load()
    assert d.name == "fashion_mnist (Debian's dataset-fashion-mnist)" and d.source == str(debian)
    assert d.x_train.shape == (3, 1, 28, 28) and d.y_test.tolist() == [0, 1]

    monkeypatch.setattr(FashionMNIST, "SYSTEM_DIR", str(tmp_path / "no_debian"))
    root = tmp_path / "data"
    downloads = []

    def download(self):  # torchvision's download, offline: the files appear in raw/
        downloads.append(self.raw_folder)
        _write_idx(Path(self.raw_folder), gz=False)

    monkeypatch.setattr(torchvision.datasets.FashionMNIST, "download", download)
    d = FashionMNIST(root=str(root), download=True).load()
    assert d.name == f"fashion_mnist (downloaded by torchvision into {root / 'FashionMNIST'})"
    assert downloads[0] == str(root / "FashionMNIST" / "raw") and d.source == str(root)
    assert d.x_train.shape == (3, 1, 28, 28) and d.y_train.tolist() == [0, 1, 2]
    d = FashionMNIST(root=str(root), download=False).load()  # the same files, there already
    assert d.name == f"fashion_mnist (read from {root / 'FashionMNIST'})"
    # the four .gz files put in raw/ by hand (compressed by anyone: torchvision would want its own MD5s and go to the
    # network): unpacked beside themselves and read, nothing downloaded
    by_hand = tmp_path / "by_hand"
    _write_idx(by_hand / "FashionMNIST" / "raw", gz=True)
    d = FashionMNIST(root=str(by_hand), download=False).load()  # torchvision would raise without the unpacked files
    assert d.name == f"fashion_mnist (read from {by_hand / 'FashionMNIST'})"
    assert d.x_train.shape == (3, 1, 28, 28) and d.y_train.tolist() == [0, 1, 2]
    (by_hand / "FashionMNIST" / "raw" / "t10k-labels-idx1-ubyte").unlink()
    (by_hand / "FashionMNIST" / "raw" / "t10k-labels-idx1-ubyte.gz").write_bytes(b"not gzip")
    with pytest.raises(ValueError, match=r"t10k-labels-idx1-ubyte.gz: not a complete gzip file"):
        FashionMNIST(root=str(by_hand), download=False).load()
    assert sorted(p.name for p in (by_hand / "FashionMNIST" / "raw").iterdir() if p.name.startswith(".")) == []


@pytest.mark.skipif(not SHARED_NPZ.is_file(), reason=f"{SHARED_NPZ} absent")
def test_npz_shared_cifar10_subset():
    d = NpzData(str(SHARED_NPZ)).load()
    assert d.x_train.shape == (10000, 3, 32, 32) and d.x_test.shape == (10000, 3, 32, 32)
    assert d.classes[:2] == ["airplane", "automobile"] and d.num_classes == 10
    assert torch.bincount(d.y_test).tolist() == [1000] * 10


def test_npz_tiny(tmp_path):
    x = np.arange(2 * 3 * 4 * 3, dtype=np.uint8).reshape(2, 3, 4, 3)  # [N, H, W, C]
    path = tmp_path / "tiny.npz"
    np.savez(path, x_train=x, y_train=np.array([0, 1]), x_test=x[:1], y_test=np.array([1]),
             classes=np.array(["cat", "dog"]))
    d = NpzData(str(path)).load()
    assert d.x_train.shape == (2, 3, 3, 4) and d.shape == (3, 4) and d.in_chans == 3
    assert d.x_train[1, 2, 0, 3] == x[1, 0, 3, 2]  # NCHW[n, c, h, w] == NHWC[n, h, w, c]
    assert d.classes == ["cat", "dog"] and d.y_test.dtype == torch.int64
    gray = tmp_path / "gray.npz"
    np.savez(gray, x_train=x[..., 0], y_train=np.array([0, 1]), x_test=x[:1, ..., 0], y_test=np.array([1]))
    g = NpzData(str(gray)).load()
    assert g.x_train.shape == (2, 1, 3, 4) and g.classes == ["0", "1"]


def test_image_folder(tmp_path):
    from torchvision.io import write_png

    for split, cls, i, size in [("train", "a", 0, 6), ("train", "b", 1, 8), ("test", "b", 2, 8), ("test", "a", 3, 8)]:
        (tmp_path / split / cls).mkdir(parents=True, exist_ok=True)
        write_png(torch.full((3, size, size), 10 * i, dtype=torch.uint8), str(tmp_path / split / cls / f"{i}.png"))
    with pytest.raises(ValueError, match="image_size"):
        ImageFolderData(str(tmp_path)).load()
    d = ImageFolderData(str(tmp_path), image_size=4).load()
    assert d.x_train.shape == (2, 3, 4, 4) and d.x_test.shape == (2, 3, 4, 4)
    assert d.classes == ["a", "b"] and d.y_test.tolist() == [0, 1]
    assert d.x_test[:, 0, 0, 0].tolist() == [30, 20]  # test/a/3.png, then test/b/2.png


def test_missing_datasets_raise_file_not_found(tmp_path, monkeypatch):
    empty = tmp_path / "empty"
    with pytest.raises(FileNotFoundError, match="download: true") as e:
        CIFAR10(root=str(empty), download=False).load()
    assert str(empty) in str(e.value)

    monkeypatch.setattr(FashionMNIST, "SYSTEM_DIR", str(tmp_path / "no_debian"))
    with pytest.raises(FileNotFoundError, match="as root or with sudo: apt-get install dataset-fashion-mnist") as e:
        FashionMNIST(root=str(empty), download=False).load()
    assert str(tmp_path / "no_debian") in str(e.value) and str(empty) in str(e.value)
    # what a user without root can do: the download, or the four files where torchvision reads them
    assert (f"without root: with download: true and network access torchvision downloads it into "
            f"{empty / 'FashionMNIST' / 'raw'}, or put the four IDX .gz files (train-images-idx3-ubyte.gz, "
            f"train-labels-idx1-ubyte.gz, t10k-images-idx3-ubyte.gz, t10k-labels-idx1-ubyte.gz) there") in str(e.value)

    with pytest.raises(FileNotFoundError, match="tiny-imagenet-200"):
        TinyImageNet(root=str(empty), download=False).load()
    with pytest.raises(FileNotFoundError, match="ImageFolder layout") as e:
        ImageFolderData(str(empty)).load()
    assert str(empty / "train") in str(e.value)
    with pytest.raises(FileNotFoundError, match="nothing.npz"):
        NpzData(str(tmp_path / "nothing.npz")).load()


def test_get_dataset():
    assert set(DATASETS) == {"fashion_mnist", "digits", "cifar10", "cifar100", "emnist_balanced",
                             "tiny_imagenet", "image_folder", "npz", "cifar10_subset"}
    ds = get_dataset("digits", split_seed=1)
    assert isinstance(ds, Digits) and ds.split_seed == 1
    with pytest.raises(ValueError, match="'fashionmnist'.*Did you mean 'fashion_mnist'"):
        get_dataset("fashionmnist")


# --------------------------------------------------------------------------- federation


class FixedCounts(Partitioner):
    """Hand-made partition: client i takes counts[i][c] samples of class c, in index order."""

    def __init__(self, counts):
        self.counts = counts

    def __call__(self, labels, num_clients, seed):
        taken, out = {}, []
        for row in self.counts:
            ix = []
            for c, k in enumerate(row):
                start = taken.get(c, 0)
                ix.extend(np.flatnonzero(labels == c)[start:start + k])
                taken[c] = start + k
            out.append(np.sort(np.array(ix, dtype=np.int64)))
        return Partition(out)


def tagged_data(train_counts, test_counts) -> ImageData:
    """Images whose first pixel is their index in the split, so draws can be traced."""
    ytr = torch.tensor(np.repeat(np.arange(len(train_counts)), train_counts), dtype=torch.int64)
    yte = torch.tensor(np.repeat(np.arange(len(test_counts)), test_counts), dtype=torch.int64)
    xtr = torch.zeros(len(ytr), 1, 2, 2, dtype=torch.uint8)
    xte = torch.zeros(len(yte), 1, 2, 2, dtype=torch.uint8)
    xtr[:, 0, 0, 0] = torch.arange(len(ytr), dtype=torch.uint8)
    xte[:, 0, 0, 0] = torch.arange(len(yte), dtype=torch.uint8)
    return ImageData("tagged", xtr, ytr, xte, yte, [f"c{k}" for k in range(len(train_counts))])


def test_client_test_sets_hand_worked():
    # train: 10 / 10 / 15 samples of classes 0 / 1 / 2; test: 20 / 20 / 2.
    data = tagged_data([10, 10, 15], [20, 20, 2])
    part = FixedCounts([[6, 3, 1], [4, 7, 9], [0, 0, 5]])
    fed = build_federation(data, part, 3, public_fraction=0.0, test_samples_per_client=10)
    got = [torch.bincount(c.y_test, minlength=3).tolist() for c in fed.clients]
    # client 0: shares of 10 by (6, 3, 1) are exact -> (6, 3, 1).
    # client 1: 10 * (4, 7, 9) / 20 = (2, 3.5, 4.5) -> floors (2, 3, 4) + 1 leftover to the
    #   first largest remainder (class 1) -> (2, 4, 4); class 2 capped at its 2 test samples.
    # client 2: only class 2, of which 2 exist -> target min(10, 2) = 2.
    assert got == [[6, 3, 1], [2, 4, 2], [0, 0, 2]]
    assert [c.class_counts.tolist() for c in fed.clients] == [[6, 3, 1], [4, 7, 9], [0, 0, 5]]
    for c in fed.clients:
        idx = c.x_test[:, 0, 0, 0].long()
        assert len(set(idx.tolist())) == len(idx)  # no replacement
        assert torch.equal(data.y_test[idx], c.y_test)  # images and labels stay paired
        assert torch.equal(data.y_train[c.x[:, 0, 0, 0].long()], c.y)


def test_public_set_size_and_no_labels():
    data = tagged_data([20, 20, 10], [5, 5, 5])  # N = 50
    fed = build_federation(data, GroupDirichlet(num_groups=2, alpha=1.0), 4, public_fraction=0.25,
                           test_samples_per_client=5, seed=3)
    # |U| = floor(0.25 * 50 + 0.5) = floor(13.0) = 13 (round half up; Python's round gives 12).
    assert fed.public.shape == (13, 1, 2, 2)
    # U and the clients split the training set exactly.
    ids = fed.public[:, 0, 0, 0].tolist() + [i for c in fed.clients for i in c.x[:, 0, 0, 0].tolist()]
    assert sorted(ids) == list(range(50))
    # No label of U is stored: public is a bare tensor and no field holds public labels.
    assert type(fed.public) is torch.Tensor
    assert [f.name for f in dataclasses.fields(fed) if "public" in f.name] == ["public"]
    assert fed.num_classes == 3 and fed.in_chans == 1 and fed.image_shape == (2, 2)


def test_federation_seed_determinism_and_subsample():
    data = Digits().load()
    kw = dict(public_fraction=0.2, test_samples_per_client=50, max_train_samples=500)
    a = build_federation(data, GroupDirichlet(), 10, seed=0, **kw)
    b = build_federation(data, GroupDirichlet(), 10, seed=0, **kw)
    c = build_federation(data, GroupDirichlet(), 10, seed=1, **kw)
    assert torch.equal(a.public, b.public) and not torch.equal(a.public, c.public)
    for ca, cb in zip(a.clients, b.clients):
        assert torch.equal(ca.x, cb.x) and torch.equal(ca.y_test, cb.y_test)
    # subsample of 500 then |U| = floor(0.2 * 500 + 0.5) = 100
    assert len(a.public) == 100 and sum(len(cl.y) for cl in a.clients) == 400


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(public_fraction=1.0), "public_fraction=1.0"),
        (dict(public_fraction=-0.1), "public_fraction=-0.1"),
        (dict(test_samples_per_client=0), "test_samples_per_client=0"),
        (dict(max_train_samples=2), "max_train_samples=2"),
    ],
)
def test_federation_validation(kwargs, field):
    data = tagged_data([10, 10, 10], [5, 5, 5])
    with pytest.raises(ValueError, match=field):
        build_federation(data, GroupDirichlet(num_groups=3), 3, **kwargs)


def test_validation_split_hand_worked():
    # client 1 holds 4 / 7 / 9 samples of classes 0 / 1 / 2 (n = 20); fraction 0.25 -> 5 validation samples,
    # shares 5 * (4, 7, 9) / 20 = (1, 1.75, 2.25) -> floors (1, 1, 2) + 1 leftover to class 1 -> (1, 2, 2)
    data = tagged_data([10, 10, 15], [20, 20, 2])
    part = FixedCounts([[6, 3, 1], [4, 7, 9], [0, 0, 5]])
    plain = build_federation(data, part, 3, public_fraction=0.0, test_samples_per_client=10)
    fed = build_federation(data, part, 3, public_fraction=0.0, test_samples_per_client=10, validation_fraction=0.25,
                           seed=0)
    c = fed.clients[1]
    assert torch.bincount(c.y_val, minlength=3).tolist() == [1, 2, 2]
    assert torch.bincount(c.y, minlength=3).tolist() == [3, 5, 7]
    # validation and training samples are disjoint and together are the client's partition
    val_ids, train_ids = set(c.x_val[:, 0, 0, 0].tolist()), set(c.x[:, 0, 0, 0].tolist())
    assert not val_ids & train_ids
    assert val_ids | train_ids == set(plain.clients[1].x[:, 0, 0, 0].tolist())
    assert torch.equal(data.y_train[c.x_val[:, 0, 0, 0].long()], c.y_val)
    # the test sets follow the whole partition, so they do not change with the validation split
    for a, b in zip(plain.clients, fed.clients):
        assert torch.equal(a.y_test, b.y_test) and torch.equal(a.x_test, b.x_test)
    assert plain.clients[0].y_val is None
    with pytest.raises(ValueError, match="data.validation_fraction=1.0"):
        build_federation(data, part, 3, public_fraction=0.0, validation_fraction=1.0)


def test_balanced_subset_draws_per_class():
    from cosmos_pl.data.datasets import balanced_subset

    labels = np.array([0, 1, 0, 1, 2, 2, 0, 2])
    keep = balanced_subset(labels, 2, seed=0)
    assert np.bincount(labels[keep]).tolist() == [2, 2, 2]
    assert np.array_equal(keep, np.sort(keep)) and np.array_equal(keep, balanced_subset(labels, 2, seed=0))
    with pytest.raises(ValueError, match="class 1 has only 2"):
        balanced_subset(labels, 3, seed=0)


def test_cifar10_subset_falls_back_to_torchvision(tmp_path, monkeypatch):
    """Without the archive, the same recipe (per_class images per class) is drawn from torchvision's CIFAR-10."""
    import torchvision

    from cosmos_pl.data import CIFAR10Subset

    rng = np.random.default_rng(0)

    class FakeCIFAR10:  # torchvision's attributes: data uint8 [N, 32, 32, 3] (HWC), targets list[int], classes
        def __init__(self, root, train, download):
            n = 40 if train else 10
            self.data = rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8)
            self.targets = [i % 10 for i in range(n)]
            self.classes = [f"c{k}" for k in range(10)]

    monkeypatch.setattr(torchvision.datasets, "CIFAR10", FakeCIFAR10)
    data = CIFAR10Subset(path=str(tmp_path / "absent.npz"), root=str(tmp_path), per_class=3, seed=0).load()
    assert tuple(data.x_train.shape) == (30, 3, 32, 32) and data.x_train.dtype == torch.uint8
    assert np.bincount(data.y_train.numpy()).tolist() == [3] * 10  # balanced: 3 of each class's 4 images
    assert tuple(data.x_test.shape) == (10, 3, 32, 32)  # the whole test set
    assert "torchvision, 3 per class, seed 0" in data.name

    monkeypatch.undo()  # the real class: no files under root and no download -> a clear error naming the archive
    with pytest.raises(FileNotFoundError, match="absent.npz"):
        CIFAR10Subset(path=str(tmp_path / "absent.npz"), root=str(tmp_path / "none"), download=False).load()

"""Split a data set into the COSMOS federation: a public unlabelled set U and clients.

The public set U is carved from the training split *before* partitioning and keeps no
labels, so no algorithm can read them (e.g. to weight its public samples).
Each client gets a test set drawn from the test split to match its own training label
distribution, so that each client is scored on data like its own.

A federation that cannot be trained is refused here, before any training: every client
needs at least ``MIN_TRAIN_SAMPLES`` = 2 training samples and a non-empty U at least 2
samples, because BatchNorm (in every backbone) normalizes over the batch in training mode
and fails on a batch of one sample. Larger sets never produce a batch of one: the training
loaders drop a last batch of one sample (``cosmos_pl.training.engine``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from cosmos_pl.errors import ConfigError, DataError

from .datasets import ImageData
from .datasets.base import check_tested_classes
from .guard import check_client_data_allowed
from .partition import MIN_TRAIN_SAMPLES, Partition, Partitioner

__all__ = ["ClientData", "Federation", "build_federation", "validation_split", "MIN_TRAIN_SAMPLES", "VALIDATION_STREAM"]

# Stream tag for the subsample / public-set draws, so they do not reuse the partitioner's
# default_rng(seed) stream nor a client's default_rng((seed, client_id)) test-set stream.
_SPLIT_STREAM = 2**31
# Stream tag of a client's validation draw: default_rng((seed, client_id, VALIDATION_STREAM)).
VALIDATION_STREAM = 2**31 + 1


@dataclass
class ClientData:
    """One client's local data.

    Attributes:
        x: uint8 [n_i, C, H, W] labelled training images.
        y: int64 [n_i] training labels.
        x_test: uint8 [t_i, C, H, W] test images from the test split, matching this
            client's training label distribution.
        y_test: int64 [t_i] test labels.
        class_counts: int64 [M] counts per class of the client's partition (training
            and validation samples together).
        x_val: uint8 [v_i, C, H, W] validation images carved from the client's own
            partition (empty without a validation split); never trained on.
        y_val: int64 [v_i] validation labels.
    """

    x: torch.Tensor
    y: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    class_counts: np.ndarray
    x_val: torch.Tensor | None = None
    y_val: torch.Tensor | None = None

    def __post_init__(self) -> None:
        check_client_data_allowed("a client's data (ClientData)")


@dataclass
class Federation:
    """The public unlabelled set and the clients (COSMOS paper, Section 6 setup).

    Attributes:
        public: uint8 [n, C, H, W], the public unlabelled set U. Its labels are not
            stored anywhere, so no algorithm can read them.
        clients: per-client data.
        partition: the partition; its indices refer to the training samples left after
            U was removed (not to the original split).
        partition_labels: int64 [N'], the labels of those samples (what the partition's
            indices point into), for reporting the partition.
        num_classes: number of classes M.
        classes: class names.
        in_chans: image channels C.
        image_shape: (H, W).
    """

    public: torch.Tensor
    clients: list[ClientData]
    partition: Partition
    partition_labels: np.ndarray
    num_classes: int
    classes: list[str]
    in_chans: int
    image_shape: tuple[int, int]

    @property
    def num_clients(self) -> int:
        return len(self.clients)


def _largest_remainder(weights: np.ndarray, total: int) -> np.ndarray:
    """Integer shares of ``total`` proportional to ``weights``, summing exactly to ``total``.

    Floors the exact shares, then gives the leftover units to the largest fractional
    parts (ties to the lower index, via a stable sort).
    """
    weights = np.asarray(weights, dtype=np.float64)
    if total <= 0 or weights.sum() <= 0:
        return np.zeros(len(weights), dtype=np.int64)
    exact = weights * total / weights.sum()
    shares = np.floor(exact).astype(np.int64)
    order = np.argsort(-(exact - shares), kind="stable")
    shares[order[: total - shares.sum()]] += 1
    return shares


def _round_half_up(x: float) -> int:
    return int(np.floor(x + 0.5))


def validation_split(labels: np.ndarray, fraction: float, num_classes: int,
                     rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Stratified split of one client's samples into (train, validation) positions.

    ``round_half_up(fraction * n)`` samples go to validation, shared over classes in proportion
    to their counts (largest-remainder rounding, each class capped by its count) and drawn
    at random within each class. Returns sorted positions into ``labels`` ``[n]``.
    """
    counts = np.bincount(labels, minlength=num_classes)
    quota = np.minimum(_largest_remainder(counts, _round_half_up(fraction * len(labels))), counts)
    val = [rng.choice(np.flatnonzero(labels == c), quota[c], replace=False) for c in range(num_classes) if quota[c]]
    val_pos = np.sort(np.concatenate(val)) if val else np.zeros(0, dtype=np.int64)
    return np.setdiff1d(np.arange(len(labels)), val_pos), val_pos


def _check_public_size(public_fraction: float, n_public: int, n_train: int) -> None:
    """Refuse a U of 1 sample, or of 0 samples when one was asked for (``public_fraction`` > 0)."""
    if public_fraction > 0 and n_public < MIN_TRAIN_SAMPLES:
        needed = math.ceil((MIN_TRAIN_SAMPLES - 0.5) / n_train * 1e6) / 1e6  # round_half_up(f * n) >= 2
        hint = f"raise it to at least {needed:g}" if needed < 1 else "use a larger data set"
        raise ConfigError(
            f"data.public_fraction={public_fraction} gives a public set U of {n_public} of the {n_train} training"
            f" samples; U needs at least {MIN_TRAIN_SAMPLES} (BatchNorm cannot train on a batch of one sample):"
            f" {hint}, or 0 for an algorithm without U"
        )


def _check_client_sizes(sizes: list[int], partitioner: Partitioner, n_train: int, validation_fraction: float,
                        max_train_samples: int | None) -> None:
    """Refuse clients with fewer than ``MIN_TRAIN_SAMPLES`` training samples, before any training.

    Raises:
        DataError: naming the clients (at most 10, then a count), their sizes, the partitioner and the fixes.
    """
    small = [(i, n) for i, n in enumerate(sizes) if n < MIN_TRAIN_SAMPLES]
    if not small:
        return
    listed = ", ".join(f"client {i}: {n}" for i, n in small[:10])
    if len(small) > 10:
        listed += f", and {len(small) - 10} more"
    args = ", ".join(f"{k}={v!r}" for k, v in vars(partitioner).items())
    fixes = [f"fewer data.num_clients (now {len(sizes)})"]
    if hasattr(partitioner, "min_samples_per_client"):
        fixes.insert(0, f"raise data.partitioner.init_args.min_samples_per_client to >= {MIN_TRAIN_SAMPLES}"
                        f" (now {partitioner.min_samples_per_client})")
    if hasattr(partitioner, "alpha"):
        fixes.append(f"a larger data.partitioner.init_args.alpha (now {partitioner.alpha})")
    if max_train_samples is not None:
        fixes.append(f"a larger data.max_train_samples (now {max_train_samples})")
    if validation_fraction > 0:
        fixes.append(f"a smaller data.validation_fraction (now {validation_fraction})")
    raise DataError(
        f"the partition leaves {len(small)} client(s) with fewer than {MIN_TRAIN_SAMPLES} training samples"
        f" ({listed}); a client needs {MIN_TRAIN_SAMPLES} to train (BatchNorm cannot train on a batch of one)."
        f" Partitioner {type(partitioner).__name__}({args}) over data.num_clients={len(sizes)} clients and"
        f" {n_train} training samples. Fix: " + ", or ".join(fixes)
    )


def build_federation(
    data: ImageData,
    partitioner: Partitioner,
    num_clients: int,
    *,
    public_fraction: float = 0.2,
    test_samples_per_client: int = 1000,
    max_train_samples: int | None = None,
    validation_fraction: float = 0.0,
    seed: int = 0,
) -> Federation:
    """Build the federation: public set U, partitioned clients and per-client test sets.

    Steps:
      1. If ``max_train_samples`` < N, keep a class-stratified random subsample of the
         training split of that size (per-class sizes by largest-remainder rounding).
      2. U = ``round_half_up(public_fraction * N')`` random training samples
         (``floor(x + 0.5)``, N' the size after step 1), labels dropped.
      3. The rest is split with ``partitioner(labels, num_clients, seed)``.
      4. Client i's test set: target ``min(test_samples_per_client, A_i)`` where A_i is
         the number of test samples in the classes client i holds; split over classes in
         proportion to its training class counts (largest-remainder rounding), drawn
         without replacement from the test split with ``default_rng((seed, i))``, each
         class capped by its availability (so a capped client may get fewer). A class that clients hold
         without any test sample is refused (DataError), not left out of their test sets.
      5. With ``validation_fraction`` > 0, client i's validation set is carved from its
         partition by :func:`validation_split` with ``default_rng((seed, i, 2**31 + 1))``;
         its test set (step 4) still follows the whole partition's label distribution.

    Args:
        data: the loaded data set.
        partitioner: how to split the remaining training samples among clients.
        num_clients: number of clients.
        public_fraction: fraction of the training split used as U, in [0, 1).
        test_samples_per_client: target test-set size per client, >= 1.
        max_train_samples: optional cap on the training split (quick demos).
        validation_fraction: fraction of each client's partition held out for
            validation, in [0, 1).
        seed: one seed for the subsample, U, the partition and the test sets.

    Returns:
        The Federation; the same inputs and seed give identical tensors.

    Raises:
        ConfigError: num_clients < 1, public_fraction outside [0, 1), test_samples_per_client < 1,
            max_train_samples < num_classes, a public_fraction > 0 that gives U fewer than 2 samples, or the
            partitioner's own ConfigError for impossible settings.
        DataError: a client left with fewer than ``MIN_TRAIN_SAMPLES`` = 2 training samples (after the
            validation split), naming the clients, their sizes, the partitioner and the fix; a class that clients
            hold without any test sample (:func:`~cosmos_pl.data.datasets.base.check_tested_classes`); or the
            partitioner's own DataError.
    """
    if num_clients < 1:
        raise ConfigError(f"data.num_clients={num_clients}: need at least 1 client")
    if not 0 <= public_fraction < 1:
        raise ConfigError(f"data.public_fraction={public_fraction}: must lie in [0, 1)")
    if test_samples_per_client < 1:
        raise ConfigError(f"data.test_samples_per_client={test_samples_per_client}: must be >= 1")
    if not 0 <= validation_fraction < 1:
        raise ConfigError(f"data.validation_fraction={validation_fraction}: must lie in [0, 1)")
    m = data.num_classes
    if max_train_samples is not None and max_train_samples < m:
        raise ConfigError(
            f"data.max_train_samples={max_train_samples} is below num_classes={m}: raise it to"
            f" at least {m} (or null for the full split)"
        )

    rng = np.random.default_rng([seed, _SPLIT_STREAM])
    y_all = data.y_train.numpy()
    keep = np.arange(len(y_all))
    if max_train_samples is not None and max_train_samples < len(y_all):
        per_class = _largest_remainder(np.bincount(y_all, minlength=m), max_train_samples)
        keep = np.sort(np.concatenate(
            [rng.choice(np.flatnonzero(y_all == c), per_class[c], replace=False) for c in range(m)]
        ))

    perm = rng.permutation(keep)
    n_public = _round_half_up(public_fraction * len(keep))
    _check_public_size(public_fraction, n_public, len(keep))
    public_idx, rest = np.sort(perm[:n_public]), np.sort(perm[n_public:])

    y_rest = y_all[rest]
    partition = partitioner(y_rest, num_clients, seed)
    counts = partition.class_counts(y_rest, m)

    y_test_all = data.y_test.numpy()
    test_by_class = [np.flatnonzero(y_test_all == c) for c in range(m)]
    available = np.array([len(ix) for ix in test_by_class], dtype=np.int64)
    check_tested_classes(data.name, data.source, data.classes, counts.sum(axis=0), available,
                         "add test samples of these classes to the test split, or leave their training samples out")

    clients = []
    for i, ix in enumerate(partition.client_indices):
        own = rest[ix]
        val_idx = None
        if validation_fraction > 0:
            train_pos, val_pos = validation_split(y_all[own], validation_fraction, m,
                                                  np.random.default_rng((seed, i, VALIDATION_STREAM)))
            own, val_idx = own[train_pos], torch.from_numpy(own[val_pos])
        train_idx = torch.from_numpy(own)
        target = min(test_samples_per_client, int(available[counts[i] > 0].sum()))
        quota = np.minimum(_largest_remainder(counts[i], target), available)
        crng = np.random.default_rng((seed, i))
        picked = [crng.choice(test_by_class[c], quota[c], replace=False) for c in range(m) if quota[c] > 0]
        test_idx = torch.from_numpy(np.sort(np.concatenate(picked)) if picked else np.zeros(0, dtype=np.int64))
        clients.append(ClientData(
            x=data.x_train[train_idx],
            y=data.y_train[train_idx],
            x_test=data.x_test[test_idx],
            y_test=data.y_test[test_idx],
            class_counts=counts[i],
            x_val=None if val_idx is None else data.x_train[val_idx],
            y_val=None if val_idx is None else data.y_train[val_idx],
        ))
    _check_client_sizes([len(c.y) for c in clients], partitioner, len(rest), validation_fraction, max_train_samples)

    return Federation(
        public=data.x_train[torch.from_numpy(public_idx)],
        clients=clients,
        partition=partition,
        partition_labels=y_rest,
        num_classes=m,
        classes=list(data.classes),
        in_chans=data.in_chans,
        image_shape=data.shape,
    )

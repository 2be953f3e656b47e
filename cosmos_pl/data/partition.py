"""Partition a labelled training split among federated clients.

Every partitioner is a pure function of ``(labels, settings, seed)``: it draws its
randomness from ``np.random.default_rng(seed)`` only, so the same call always gives the
same partition (a run is reproducible from its seed alone). Every one terminates for every input, gives each
sample to exactly one client (none is dropped) and raises a user error when a request is
impossible (where a Dirichlet partitioner could loop forever or produce NaN probabilities):
``ConfigError`` for a setting no labels can meet (e.g. more clients times the minimum client
size than samples), ``DataError`` for bad labels. Both are ``ValueError``; messages name the
dotted setting (``data.num_clients``, ``data.partitioner.init_args.alpha``, ...).

``min_samples_per_client`` defaults to 2 (:data:`MIN_TRAIN_SAMPLES`): a client with one
sample can only train on batches of one, which BatchNorm rejects.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cosmos_pl.errors import ConfigError, DataError

__all__ = [
    "Partition",
    "group_dirichlet",
    "dirichlet",
    "iid",
    "Partitioner",
    "GroupDirichlet",
    "Dirichlet",
    "IID",
    "MIN_TRAIN_SAMPLES",
]

# Dirichlet proportions are drawn up to this many times to meet min_samples_per_client; if the last draw still
# leaves clients short, they are topped up from the largest clients (_top_up): redrawing alone can take many draws
# at a small alpha and many clients (docs/performance.md), and may never succeed.
MAX_ATTEMPTS = 3
# Fewest training samples a client can train on: BatchNorm normalizes over the batch in training mode and
# fails on a batch of one sample, and a client with one sample only ever has batches of one.
MIN_TRAIN_SAMPLES = 2
_KEY = "data.partitioner.init_args."


@dataclass
class Partition:
    """Which samples each client holds.

    Attributes:
        client_indices: per client, a sorted int64 array of indices into the labels array
            that was partitioned.
        groups: int array [num_clients], the true group id of each client
            (``group_dirichlet`` only, else None). Only for scoring clustering in reports;
            algorithms must not read it (a server cannot know the true groups).
        class_groups: the sorted classes of each group (``group_dirichlet`` only, else None).
    """

    client_indices: list[np.ndarray]
    groups: np.ndarray | None = None
    class_groups: list[list[int]] | None = None

    @property
    def num_clients(self) -> int:
        return len(self.client_indices)

    @property
    def sizes(self) -> np.ndarray:
        """int64 [num_clients]: number of samples per client."""
        return np.array([len(ix) for ix in self.client_indices], dtype=np.int64)

    def class_counts(self, labels: np.ndarray, num_classes: int) -> np.ndarray:
        """Count each client's samples per class.

        Args:
            labels: int array [N], the labels that were partitioned.
            num_classes: number of classes M (columns of the result).

        Returns:
            int64 array [num_clients, num_classes].
        """
        labels = np.asarray(labels)
        counts = np.zeros((self.num_clients, num_classes), dtype=np.int64)
        for i, ix in enumerate(self.client_indices):
            counts[i] = np.bincount(labels[ix], minlength=num_classes)[:num_classes]
        return counts

    def to_json(self, labels: np.ndarray, num_classes: int) -> dict:
        """A JSON-serialisable summary (no raw index lists, which would be large).

        Returns:
            dict with keys ``num_clients``, ``groups`` (list or None), ``class_groups``,
            ``class_counts`` (list of lists, ``[num_clients][num_classes]``) and ``sizes``.
        """
        return {
            "num_clients": self.num_clients,
            "groups": None if self.groups is None else [int(g) for g in self.groups],
            "class_groups": self.class_groups,
            "class_counts": self.class_counts(labels, num_classes).tolist(),
            "sizes": [int(s) for s in self.sizes],
        }


# --------------------------------------------------------------------------- helpers


def _check_labels(labels: np.ndarray) -> np.ndarray:
    labels = np.asarray(labels)
    if labels.ndim != 1:
        raise DataError(f"labels must be a 1-D array, got shape {labels.shape}")
    if labels.size and not np.issubdtype(labels.dtype, np.integer):
        raise DataError(f"labels must be integers, got dtype {labels.dtype}")
    if labels.size and labels.min() < 0:
        raise DataError(f"labels must be non-negative class indices, got {labels.min()}")
    return labels.astype(np.int64)


def _check_common(labels: np.ndarray, num_clients: int, min_samples_per_client: int) -> None:
    if num_clients < 1:
        raise ConfigError(f"data.num_clients={num_clients}: need at least 1 client")
    if min_samples_per_client < 0:
        raise ConfigError(f"{_KEY}min_samples_per_client={min_samples_per_client}: must be >= 0")
    if num_clients * min_samples_per_client > len(labels):
        raise ConfigError(
            f"data.num_clients * {_KEY}min_samples_per_client = {num_clients} * {min_samples_per_client}"
            f" = {num_clients * min_samples_per_client} exceeds the {len(labels)} training samples"
            " available: lower data.num_clients or min_samples_per_client (or use more data)"
        )


def _check_alpha(alpha: float) -> None:
    if not alpha > 0 or not np.isfinite(alpha):
        raise ConfigError(f"{_KEY}alpha={alpha}: the Dirichlet concentration must be finite and > 0")


def _proportions(rng: np.random.Generator, alpha: float, k: int) -> np.ndarray:
    """Draw p ~ Dirichlet(alpha * ones(k)), guarded against NaN / all-zero draws.

    With tiny alpha the gamma draws can all underflow to 0; the limit of the Dirichlet
    as alpha -> 0 puts all mass on one coordinate, so fall back to a random one-hot.
    """
    with np.errstate(all="ignore"):
        p = rng.dirichlet(np.full(k, alpha))
    total = p.sum()
    if not np.all(np.isfinite(p)) or not total > 0:
        p = np.zeros(k)
        p[rng.integers(k)] = 1.0
        return p
    return p / total


def _split_by_proportions(idx: np.ndarray, p: np.ndarray) -> list[np.ndarray]:
    """Split ``idx`` into len(p) consecutive chunks with sizes from cumulative-sum rounding.

    Rounding the cumulative sum (not each share) makes the chunk sizes sum exactly to
    len(idx), so every sample goes to exactly one chunk.
    """
    n = len(idx)
    bounds = np.round(np.cumsum(p) * n).astype(np.int64)
    bounds = np.clip(bounds, 0, n)
    bounds[-1] = n
    return np.split(idx, bounds[:-1])


def _top_up(final: list[np.ndarray], minimum: int, rng: np.random.Generator,
            groups: np.ndarray | None = None, mixed: bool = True) -> list[np.ndarray]:
    """Give every client below ``minimum`` samples the missing ones, drawn at random from the largest client
    above the minimum (lowest index on ties), one client at a time in client order. With ``groups`` the donor
    comes from the client's own group, so it gets its group's classes; only when ``mixed`` (clients already
    hold other groups' samples) may a client of another group give. O(num_clients^2) at worst.

    Raises:
        DataError: no donor: the client's group holds too few samples and the partition is not mixed.
    """
    final = [np.asarray(ix) for ix in final]
    sizes = np.array([len(ix) for ix in final])
    for i in np.flatnonzero(sizes < minimum):
        while sizes[i] < minimum:
            able = sizes > minimum
            if groups is not None and (able & (groups == groups[i])).any():
                able &= groups == groups[i]
            elif groups is not None and not mixed:
                raise DataError(
                    f"{_KEY}min_samples_per_client={minimum} cannot be met: the classes of client {i}'s group hold "
                    f"too few samples for its {int((groups == groups[i]).sum())} clients and mix_fraction is 0; "
                    "raise mix_fraction, or lower min_samples_per_client or data.num_clients")
            donor = int(np.flatnonzero(able)[np.argmax(sizes[able])])
            k = int(min(minimum - sizes[i], sizes[donor] - minimum))
            take = np.zeros(sizes[donor], dtype=bool)
            take[rng.choice(sizes[donor], k, replace=False)] = True
            final[i] = np.sort(np.concatenate([final[i], final[donor][take]]))
            final[donor] = final[donor][~take]
            sizes[i] += k
            sizes[donor] -= k
    return final


def _finish(parts: list[list[np.ndarray]]) -> list[np.ndarray]:
    return [
        np.sort(np.concatenate(p)).astype(np.int64) if p else np.zeros(0, dtype=np.int64)
        for p in parts
    ]


# --------------------------------------------------------------------------- partitioners


def group_dirichlet(
    labels: np.ndarray,
    num_clients: int,
    *,
    num_groups: int = 5,
    alpha: float = 5.0,
    mix_fraction: float = 0.1,
    min_samples_per_client: int = MIN_TRAIN_SAMPLES,
    seed: int = 0,
) -> Partition:
    """Group-structured Dirichlet partition (COSMOS paper, Section 6).

    The classes present are shuffled and split into ``num_groups`` disjoint groups
    (``np.array_split``: sizes differ by at most 1). Client i belongs to group
    ``i % num_groups``. Each class's samples are split among its group's clients with
    proportions ~ Dirichlet(alpha * ones). Then ``floor(mix_fraction * size)`` random
    samples of every client are pooled, the pool is shuffled and dealt round-robin to all
    clients (client j gets ``pool[j::num_clients]``).

    Args:
        labels: int array [N] of class indices.
        num_clients: number of clients.
        num_groups: number of client groups (= class groups).
        alpha: Dirichlet concentration within a group (larger = more even).
        mix_fraction: fraction of each client's samples pooled and redealt, in [0, 1).
        min_samples_per_client: smallest acceptable final client size (default 2, see
            ``MIN_TRAIN_SAMPLES``); proportions are drawn up to ``MAX_ATTEMPTS`` times to meet it, then
            clients still short take the missing samples at random from the largest client of their group
            (of any group when ``mix_fraction > 0`` and their group has none to spare).
        seed: seed of ``np.random.default_rng``.

    Returns:
        A Partition with ``groups`` (int [num_clients]) and ``class_groups`` set.

    Raises:
        ConfigError: impossible settings (num_clients < 1 or < num_groups, num_groups
            larger than the number of classes present, alpha <= 0, mix_fraction outside
            [0, 1), num_clients * min_samples_per_client > N).
        DataError: labels not 1-D non-negative integers, or, with ``mix_fraction = 0``, a group whose classes
            hold fewer than ``min_samples_per_client`` samples per client.
    """
    labels = _check_labels(labels)
    _check_common(labels, num_clients, min_samples_per_client)
    if num_groups < 1:
        raise ConfigError(f"{_KEY}num_groups={num_groups}: need at least 1 group")
    if num_clients < num_groups:
        raise ConfigError(
            f"data.num_clients={num_clients} < {_KEY}num_groups={num_groups}: every group needs a"
            " client; raise data.num_clients or lower num_groups"
        )
    present = np.unique(labels)
    if num_groups > len(present):
        raise ConfigError(
            f"{_KEY}num_groups={num_groups} exceeds the {len(present)} classes present in the"
            " labels: groups of classes must be disjoint and non-empty; lower num_groups"
        )
    _check_alpha(alpha)
    if not 0 <= mix_fraction < 1:
        raise ConfigError(f"{_KEY}mix_fraction={mix_fraction}: must lie in [0, 1)")

    rng = np.random.default_rng(seed)
    class_groups = [sorted(int(c) for c in g) for g in np.array_split(rng.permutation(present), num_groups)]
    groups = np.arange(num_clients) % num_groups
    members = [np.flatnonzero(groups == g) for g in range(num_groups)]
    by_class = {int(c): rng.permutation(np.flatnonzero(labels == c)) for c in present}

    for _ in range(MAX_ATTEMPTS):
        parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
        for g, classes in enumerate(class_groups):
            for c in classes:
                p = _proportions(rng, alpha, len(members[g]))
                for client, chunk in zip(members[g], _split_by_proportions(by_class[c], p)):
                    parts[client].append(chunk)
        owned = _finish(parts)

        # Mixing step: pool floor(mix_fraction * size) random samples of every client.
        kept, pool = [], []
        for ix in owned:
            take = np.zeros(len(ix), dtype=bool)
            take[rng.choice(len(ix), int(np.floor(mix_fraction * len(ix))), replace=False)] = True
            kept.append(ix[~take])
            pool.append(ix[take])
        pool = rng.permutation(np.concatenate(pool))
        final = [np.sort(np.concatenate([kept[j], pool[j::num_clients]])) for j in range(num_clients)]

        if min(len(ix) for ix in final) >= min_samples_per_client:
            break
    else:
        final = _top_up(final, min_samples_per_client, rng, groups, mixed=mix_fraction > 0)
    return Partition(final, groups=groups, class_groups=class_groups)


def dirichlet(
    labels: np.ndarray,
    num_clients: int,
    *,
    alpha: float = 0.5,
    min_samples_per_client: int = MIN_TRAIN_SAMPLES,
    seed: int = 0,
) -> Partition:
    """Common label-skew partition: each class split over all clients by Dirichlet(alpha).

    Args:
        labels: int array [N] of class indices.
        num_clients: number of clients.
        alpha: Dirichlet concentration (larger = closer to IID).
        min_samples_per_client: smallest acceptable client size (default 2, see
            ``MIN_TRAIN_SAMPLES``); proportions are drawn up to ``MAX_ATTEMPTS`` times to meet it, then
            clients still short take the missing samples at random from the largest clients.
        seed: seed of ``np.random.default_rng``.

    Returns:
        A Partition (``groups`` and ``class_groups`` are None).

    Raises:
        ConfigError: num_clients < 1, alpha <= 0, num_clients * min_samples_per_client > N.
        DataError: bad labels.
    """
    labels = _check_labels(labels)
    _check_common(labels, num_clients, min_samples_per_client)
    _check_alpha(alpha)
    rng = np.random.default_rng(seed)
    by_class = [rng.permutation(np.flatnonzero(labels == c)) for c in np.unique(labels)]
    for _ in range(MAX_ATTEMPTS):
        parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
        for idx in by_class:
            for client, chunk in enumerate(_split_by_proportions(idx, _proportions(rng, alpha, num_clients))):
                parts[client].append(chunk)
        final = _finish(parts)
        if min(len(ix) for ix in final) >= min_samples_per_client:
            break
    else:
        final = _top_up(final, min_samples_per_client, rng)
    return Partition(final)


def iid(labels: np.ndarray, num_clients: int, *, seed: int = 0) -> Partition:
    """IID partition: a random permutation cut into near-equal parts (np.array_split).

    Args:
        labels: int array [N] (only its length is used).
        num_clients: number of clients.
        seed: seed of ``np.random.default_rng``.

    Raises:
        ConfigError: num_clients < 1 or num_clients > N (a client would be empty).
    """
    labels = _check_labels(labels)
    _check_common(labels, num_clients, 0)
    if num_clients > len(labels):
        raise ConfigError(f"data.num_clients={num_clients} exceeds the {len(labels)} training samples: a client"
                          " would be empty; lower data.num_clients (or use more data)")
    perm = np.random.default_rng(seed).permutation(len(labels))
    return Partition([np.sort(p).astype(np.int64) for p in np.array_split(perm, num_clients)])


# --------------------------------------------------------------------------- config classes


class Partitioner:
    """Base class of partitioners chosen in configs (``class_path`` / ``init_args``)."""

    def __call__(self, labels: np.ndarray, num_clients: int, seed: int) -> Partition:
        """Partition ``labels`` (int [N]) among ``num_clients`` clients with ``seed``."""
        raise NotImplementedError


class GroupDirichlet(Partitioner):
    """Group-structured Dirichlet partition of the COSMOS paper (Section 6)."""

    def __init__(
        self,
        num_groups: int = 5,
        alpha: float = 5.0,
        mix_fraction: float = 0.1,
        min_samples_per_client: int = MIN_TRAIN_SAMPLES,
    ) -> None:
        """Configure the partition.

        Args:
            num_groups: number of client groups; the classes are split into this many
                disjoint groups and client i joins group i % num_groups.
            alpha: Dirichlet concentration used to split a class among its group's clients.
            mix_fraction: fraction of each client's samples pooled and dealt to all
                clients, in [0, 1).
            min_samples_per_client: smallest acceptable client size (default 2: a client
                needs two samples to train with BatchNorm).
        """
        self.num_groups = num_groups
        self.alpha = alpha
        self.mix_fraction = mix_fraction
        self.min_samples_per_client = min_samples_per_client

    def __call__(self, labels: np.ndarray, num_clients: int, seed: int) -> Partition:
        return group_dirichlet(
            labels,
            num_clients,
            num_groups=self.num_groups,
            alpha=self.alpha,
            mix_fraction=self.mix_fraction,
            min_samples_per_client=self.min_samples_per_client,
            seed=seed,
        )


class Dirichlet(Partitioner):
    """Per-class Dirichlet label skew over all clients."""

    def __init__(self, alpha: float = 0.5, min_samples_per_client: int = MIN_TRAIN_SAMPLES) -> None:
        """Configure the partition.

        Args:
            alpha: Dirichlet concentration (larger = closer to IID).
            min_samples_per_client: smallest acceptable client size (default 2: a client
                needs two samples to train with BatchNorm).
        """
        self.alpha = alpha
        self.min_samples_per_client = min_samples_per_client

    def __call__(self, labels: np.ndarray, num_clients: int, seed: int) -> Partition:
        return dirichlet(
            labels,
            num_clients,
            alpha=self.alpha,
            min_samples_per_client=self.min_samples_per_client,
            seed=seed,
        )


class IID(Partitioner):
    """Uniformly random partition into near-equal client sizes."""

    def __call__(self, labels: np.ndarray, num_clients: int, seed: int) -> Partition:
        return iid(labels, num_clients, seed=seed)

"""From a configured ``b0`` to the clients' clusters: the one entry point COSMOS's server step calls.

``b0`` is a number (Algorithm 1 at that threshold B0), a threshold rule (``strict``, ``silhouette``, ``otsu``,
``inf``: :mod:`~cosmos_pl.clustering.threshold` chooses B0, then Algorithm 1), or ``auto``, the default, which
clusters cluster by cluster without one threshold (:mod:`~cosmos_pl.clustering.per_cluster`), keeping the
clusters of a cut that beats chance (:mod:`~cosmos_pl.clustering.chance`); ``silhouette_floor`` is the same with a
fixed keep rule instead of the permutation test (a mean silhouette of 0.2 and a persistence of 1.2). Every rule reads the client
distances only, never group ids.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional, Sequence, Union

import numpy as np

from cosmos_pl.clustering.greedy import greedy_labels
from cosmos_pl.clustering.chance import ALPHA
from cosmos_pl.clustering.per_cluster import CHANCE_MIN_CLIENTS, FLOOR, PERSISTENCE, per_cluster_clustering
from cosmos_pl.clustering.threshold import RULES, resolve_b0

__all__ = ["B0_SETTINGS", "ClientClustering", "check_b0", "cluster_clients"]

#: The named settings of ``algorithm.init_args.b0`` (besides a number >= 0).
B0_SETTINGS = ("auto", "silhouette_floor", *RULES)
PER_CLUSTER = {"auto": "chance", "silhouette_floor": "floor"}  # the settings that cluster cluster by cluster


@dataclass
class ClientClustering:
    """The clusters of one clustering round.

    Attributes:
        labels: each client's cluster ``[N]`` (0..K-1).
        rule: the setting that made it (``auto``, ``strict``, ..., or ``number`` for a given B0).
        b0: Algorithm 1's threshold B0 (None for ``auto``, which uses none).
        left: (``auto``) the clients that left their cluster for a teacher of their own.
        dissolved: (``auto``) the clients of the start cut's clusters that were not kept (a teacher of their own).
        start_k: (``auto``) K of the start cut.
        placed: (``auto``) each uninformative client placed after the others were clustered, with the informative
            client whose cluster it joined.
        unplaced: (``auto``) uninformative clients left alone (no informative cluster clearly nearest).
        read_all: (``auto``) uninformative clients were named but too few informative ones remained: the rule read
            every client and placed none.
        tests: (``auto``) the start cut's chance test: ``[(clients, mean silhouette, p-value)]``
            (:class:`~cosmos_pl.clustering.per_cluster.PerCluster`).

    ``auto`` above also holds for ``silhouette_floor`` (no ``tests``).
    """

    labels: np.ndarray
    rule: str
    b0: Optional[float] = None
    left: list[int] = field(default_factory=list)
    dissolved: list[int] = field(default_factory=list)
    start_k: Optional[int] = None
    placed: dict[int, int] = field(default_factory=dict)
    unplaced: list[int] = field(default_factory=list)
    read_all: bool = False
    tests: list[tuple[int, float, float]] = field(default_factory=list)

    @property
    def clusters(self) -> list[list[int]]:
        """Each cluster's clients, sorted, in order of its label."""
        return [np.flatnonzero(self.labels == k).tolist() for k in range(int(self.labels.max()) + 1)]

    def describe(self, ids: Optional[Sequence[int]] = None) -> str:
        """How the clusters were chosen, for the run's clustering line; ``ids`` names the client of each row of the
        distances (default: row j is client j)."""
        if self.rule in PER_CLUSTER:
            name = (lambda j: j) if ids is None else (lambda j: ids[j])
            placed = (f"; uninformative clients placed with the nearest informative one: "
                      f"{', '.join(f'{name(c)} -> {name(j)}' for c, j in self.placed.items())}" if self.placed else "")
            if self.unplaced:
                placed += (f"; uninformative clients alone (no informative cluster clearly nearest): "
                           f"{[name(c) for c in self.unplaced]}")
            if self.read_all:
                placed += "; too few informative clients to place the uninformative ones by: the rule read every client"
            if self.rule == "auto" and self.tests:
                tests = ", ".join(f"{m} clients: {sil:.3f}, p {p:.2f}" for m, sil, p in self.tests)
                keep = (f"the cut is kept where its mean silhouette beats chance (shuffles of the distances, "
                        f"p <= {ALPHA}): [{tests}]")
            else:
                few = (f" (fewer than {CHANCE_MIN_CLIENTS} clients to test against chance)"
                       if self.rule == "auto" else "")
                keep = f"a cluster is kept at a mean silhouette >= {FLOOR} and persistence >= {PERSISTENCE}{few}"
            return (f"{self.rule}: average linkage, start cut K={self.start_k}; {keep}; left their cluster: "
                    f"{[name(j) for j in self.left]}; alone from clusters not kept (before placement): "
                    f"{[name(j) for j in self.dissolved]}{placed}")
        return f"B0={self.b0:.4f} ({self.rule})"


def check_b0(b0: Union[float, str]) -> None:
    """Raise ValueError naming the allowed values unless ``b0`` is a number >= 0 or one of :data:`B0_SETTINGS`."""
    if isinstance(b0, str):
        if b0 not in B0_SETTINGS:
            raise ValueError(f"b0={b0!r}: give a number >= 0 (Algorithm 1's threshold), 'auto' (cluster by cluster), "
                             "'silhouette_floor', 'strict', 'silhouette', 'otsu' or 'inf'")
    elif isinstance(b0, bool) or not isinstance(b0, (int, float)) or math.isnan(b0) or b0 < 0:
        raise ValueError(f"b0={b0!r}: the threshold must be a number >= 0")


def cluster_clients(b0: Union[float, str], distances: np.ndarray,
                    uninformative: Sequence[int] = ()) -> ClientClustering:
    """The clients' clusters under the setting ``b0`` (see the module docstring).

    Args:
        b0: a number >= 0, or one of :data:`B0_SETTINGS`.
        distances: ``[N, N]`` symmetric client distances.
        uninformative: rows of ``distances`` whose clients uploaded (nearly) one distribution for every public
            sample; ``auto`` places them after clustering the others
            (:func:`~cosmos_pl.clustering.per_cluster.per_cluster_clustering`); the threshold rules ignore it.

    Raises:
        ValueError: a bad ``b0`` (naming the value and what is allowed), a non-square matrix, or an
            ``uninformative`` row outside the matrix.
    """
    check_b0(b0)
    if b0 in PER_CLUSTER:
        found = per_cluster_clustering(distances, uninformative=uninformative, keep=PER_CLUSTER[b0])
        return ClientClustering(found.labels, b0, None, found.left, found.alone_dissolved,
                                int(found.start.max()) + 1, found.placed, found.unplaced, found.read_all, found.tests)
    threshold = resolve_b0(b0, distances)
    return ClientClustering(greedy_labels(distances, threshold), b0 if isinstance(b0, str) else "number", threshold)

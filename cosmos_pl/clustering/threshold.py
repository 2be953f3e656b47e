"""Rules that choose the threshold B0 of Algorithm 1 from the client distances alone (never from group ids):
``strict`` (the best silhouette among the clusterings that separate their clusters over the whole federation, if it
reaches 0.25; else every client alone: no cluster unless every cluster is separated), ``silhouette`` (the best
silhouette among all), ``otsu``, ``inf``, or a number; and :func:`structure`, how clearly a clustering separates the
clients. The default, ``auto``, chooses no threshold (:mod:`cosmos_pl.clustering.per_cluster`).

How each rule fares at 10 clients on the shipped configs (K, the adjusted Rand index against the true groups, and the
teacher's gain over local-only, per seed) is in docs/performance.md ("The threshold rules at 10 clients").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Literal, Optional, Union

import numpy as np

from cosmos_pl.clustering.greedy import greedy_labels

__all__ = ["otsu_threshold", "silhouette_threshold", "separated_threshold", "silhouette", "silhouettes",
           "structure", "Structure", "resolve_b0", "B0", "RULES", "EXHAUSTIVE_CANDIDATES", "WEAK_SILHOUETTE",
           "FLOOR", "separated_candidates"]

#: A cluster is kept when its clients' mean silhouette (against the other clusters) reaches this. Chosen on the
#: planted federations of ``benchmarks/cluster_recovery.py``: 0.25 split true groups whose uploads overlap in a few
#: pairs (their silhouettes there are 0.2-0.4), 0.15 kept merged groups at the highest overlap.
FLOOR = 0.2

B0 = Union[float, Literal["auto", "silhouette_floor", "strict", "silhouette", "otsu", "inf"]]

#: Below this mean silhouette a clustering shows "no substantial structure" (Kaufman and Rousseeuw, 1990, Ch. 2).
WEAK_SILHOUETTE = 0.25

# ``silhouette`` tries every distinct distance while there are at most this many (N <= 64 clients); above, it searches
# coarse to fine (see silhouette_threshold).
EXHAUSTIVE_CANDIDATES = 2048
_GRID = 256


def silhouettes(distances: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Each client's silhouette (Rousseeuw, 1987) ``[N]`` under cluster ``labels`` ``[N]`` (0..K-1) on a
    precomputed ``[N, N]`` distance matrix: ``(b - a) / max(a, b)`` with a the mean distance to the other clients
    of its cluster and b the smallest mean distance to another cluster; 0 for a client alone, as
    ``sklearn.metrics.silhouette_samples(..., metric="precomputed")``. O(N^2).

    Raises:
        ValueError: fewer than 2 or more than N - 1 clusters (the silhouette is undefined).
    """
    n = len(labels)
    counts = np.bincount(labels)
    k = len(counts)
    if not 2 <= k <= n - 1:
        raise ValueError(f"the silhouette needs 2 <= K <= N - 1 clusters, got K={k} for N={n}")
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    # [N, K]: distance from each client to each cluster; clients already in label order need no reordered copy
    ordered = distances if bool(np.all(labels[1:] >= labels[:-1])) else distances[:, np.argsort(labels, kind="stable")]
    sums = np.add.reduceat(ordered, starts, axis=1)
    rows = np.arange(n)
    with np.errstate(divide="ignore", invalid="ignore"):
        intra = sums[rows, labels] / (counts[labels] - 1)
        means = sums / counts
        means[rows, labels] = np.inf
        inter = means.min(axis=1)
        s = (inter - intra) / np.maximum(intra, inter)
    return np.nan_to_num(s)


def silhouette(distances: np.ndarray, labels: np.ndarray) -> float:
    """Mean silhouette of ``labels`` ``[N]`` (:func:`silhouettes`), as ``sklearn.metrics.silhouette_score(...,
    metric="precomputed")`` defines it (a client alone in its cluster scores 0), in O(N^2).

    Raises:
        ValueError: fewer than 2 or more than N - 1 clusters (the silhouette is undefined).
    """
    return float(silhouettes(distances, labels).mean())


@dataclass(frozen=True)
class Structure:
    """How clearly a clustering separates the clients, from the distances alone (what a deployment has too).

    Attributes:
        K: the number of clusters; N: the number of clients.
        silhouette: the mean silhouette over all clients (:func:`silhouette`; a client alone scores 0), None where
            K = 1 or K = N (undefined).
        within_max: the farthest distance between two clients of one cluster (0 when every cluster has one client).
        between_min: the nearest distance between clients of different clusters (inf when K = 1).
        alone: the clients alone in their cluster (a teacher of their own).
        clustered_silhouette: the mean silhouette of the clients that share a cluster (None when none do, or K = 1).
        weakest: the lowest mean silhouette of a cluster of two or more clients (None when there is none, or K = 1).
    """

    K: int
    N: int
    silhouette: Optional[float]
    within_max: float
    between_min: float
    alone: int = 0
    clustered_silhouette: Optional[float] = None
    weakest: Optional[float] = None

    @property
    def separation(self) -> float:
        """``between_min / within_max``: above 1, every client is closer to each client of its own cluster than to
        any client of another (inf when no cluster has two clients)."""
        return math.inf if self.within_max == 0 else self.between_min / self.within_max

    @property
    def separated(self) -> bool:
        """Every within-cluster distance is below every between-cluster distance (``separation > 1``)."""
        return self.between_min > self.within_max

    @property
    def weak(self) -> bool:
        """The clustering does not show groups the uploads support (N > 2): no two clients were grouped (K = N), all
        were (K = 1), the clients that share clusters show no substantial structure (their mean silhouette below
        :data:`WEAK_SILHOUETTE`), or some cluster's clients are on average barely nearer each other than another
        cluster (its mean silhouette below the ``auto`` rule's floor,
        :data:`FLOOR`). Overlapping distance ranges alone (not :attr:`separated`)
        are not weak: with many clients a few pairs overlap in any clustering."""
        return bool(self.reasons())

    def reasons(self) -> list[str]:
        """Why :attr:`weak` holds, in words (empty when it does not)."""
        if self.N <= 2:
            return []
        out = []
        if self.K == self.N:
            out.append("no two clients share a cluster (K = N)")
        if self.K == 1:
            out.append("one cluster: nothing to compare its clients' distances with")
        if self.clustered_silhouette is not None and self.clustered_silhouette < WEAK_SILHOUETTE:
            out.append(f"silhouette of the clustered clients {self.clustered_silhouette:.3f} < {WEAK_SILHOUETTE}")
        if self.weakest is not None and self.weakest < FLOOR:
            out.append(f"a cluster's mean silhouette is {self.weakest:.3f} < {FLOOR}")
        return out

    def as_dict(self) -> dict[str, Any]:
        """The record in clusters.json (floats rounded to 6 digits; inf as None)."""
        def num(v: Optional[float]) -> Optional[float]:
            return None if v is None or not math.isfinite(v) else round(float(v), 6)

        return {"silhouette": num(self.silhouette), "within_max": num(self.within_max),
                "between_min": num(self.between_min), "separation": num(self.separation),
                "separated": self.separated, "alone": self.alone,
                "clustered_silhouette": num(self.clustered_silhouette), "weakest_cluster_silhouette": num(self.weakest),
                "weak": self.weak}


def structure(distances: np.ndarray, labels: np.ndarray) -> Structure:
    """:class:`Structure` of cluster ``labels`` ``[N]`` on the ``[N, N]`` client distances. O(N^2)."""
    d = np.asarray(distances, dtype=float)
    labels = np.unique(np.asarray(labels), return_inverse=True)[1]
    n = len(labels)
    same = labels[:, None] == labels[None, :]
    off = ~np.eye(n, dtype=bool)
    within = d[same & off]
    between = d[~same]
    counts = np.bincount(labels)
    k = len(counts)
    sil = clustered = weakest = None
    if 2 <= k <= n - 1:
        s = silhouettes(d, labels)
        sil = float(s.mean())
        shared = counts[labels] > 1
        if shared.any():
            clustered = float(s[shared].mean())
            weakest = float(min(s[labels == c].mean() for c in np.flatnonzero(counts > 1)))
    return Structure(k, n, sil, float(within.max()) if within.size else 0.0,
                     float(between.min()) if between.size else math.inf, int((counts == 1).sum()), clustered, weakest)


def otsu_threshold(distances: np.ndarray) -> float:
    """The ``otsu`` rule for B0: Otsu's threshold on the off-diagonal pairwise distances.

    The N(N-1)/2 distances are split into a "close" and a "far" class at the cut that maximizes the
    between-class variance (Otsu, 1979); B0 is the midpoint between the largest close and the smallest far
    distance. When every distance is equal there is no cut and B0 = that distance (one cluster). Limit: it
    assumes at least two distinct levels of similarity; with IID clients it still splits at the widest gap,
    so pass a number there. O(N^2 log N).

    Args:
        distances: ``[N, N]`` symmetric client distances, N >= 2.

    Returns:
        B0 as a float.
    """
    d = np.asarray(distances, dtype=float)
    values = np.sort(d[np.triu_indices(d.shape[0], k=1)])
    if values.size == 0:
        return 0.0
    if values[0] == values[-1]:
        return float(values[0])
    m = values.size
    cumsum = np.cumsum(values)
    cut = np.arange(1, m)  # close = values[:cut], far = values[cut:]
    mu0 = cumsum[cut - 1] / cut
    mu1 = (cumsum[-1] - cumsum[cut - 1]) / (m - cut)
    score = (cut / m) * ((m - cut) / m) * (mu0 - mu1) ** 2
    score[values[cut - 1] == values[cut]] = -1.0  # never split equal values
    best = int(cut[int(np.argmax(score))])  # the first maximum, as a left-to-right scan keeps it
    return float((values[best - 1] + values[best]) / 2)


def _score(d: np.ndarray, b0: float, seen: dict[bytes, Optional[float]]) -> Optional[float]:
    labels = greedy_labels(d, b0)
    key = labels.tobytes()
    if key not in seen:  # neighbouring thresholds often give the same clustering
        seen[key] = silhouette(d, labels) if 2 <= labels.max() + 1 <= len(labels) - 1 else None
    return seen[key]


def _best_threshold(distances: np.ndarray) -> Optional[float]:
    """The B0 whose Algorithm 1 clustering has the best silhouette; None when no clustering has one (N <= 2)."""
    d = np.asarray(distances, dtype=float)
    values = np.unique(d[np.triu_indices(d.shape[0], k=1)])
    seen: dict[bytes, Optional[float]] = {}
    best, best_b0 = -np.inf, None

    def consider(indices: np.ndarray) -> Optional[int]:
        nonlocal best, best_b0
        level_best, level_pos = -np.inf, None
        for pos, i in enumerate(indices):
            score = _score(d, float(values[i]), seen)
            if score is None:
                continue
            if score > level_best + 1e-12:
                level_best, level_pos = score, pos
            if score > best + 1e-12 or (abs(score - best) <= 1e-12 and values[i] < best_b0):
                best, best_b0 = score, float(values[i])
        return level_pos

    lo, hi = 0, len(values) - 1
    limit = EXHAUSTIVE_CANDIDATES
    while hi >= lo:
        if hi - lo + 1 <= limit:
            consider(np.arange(lo, hi + 1))
            break
        grid = np.unique(np.round(np.linspace(lo, hi, _GRID)).astype(np.int64))
        pos = consider(grid)
        if pos is None:
            break
        lo, hi = int(grid[max(pos - 1, 0)]), int(grid[min(pos + 1, len(grid) - 1)])
        limit = _GRID
    return best_b0


def silhouette_threshold(distances: np.ndarray) -> float:
    """The ``silhouette`` rule for B0 (the default of earlier cosmos-pl releases): the threshold whose
    Algorithm 1 clustering has the best silhouette score.

    Candidates are the distinct off-diagonal distances (Algorithm 1's result changes only there). With at most
    :data:`EXHAUSTIVE_CANDIDATES` of them (N <= 64) every one is tried. Above that (N(N-1)/2 would mean ~10^5
    clusterings at N = 500) the search goes coarse to fine: 256 candidates spread evenly over the sorted distinct
    distances, then again between the best one's neighbours, until the interval holds at most 256 distances,
    which are all tried (about 600 clusterings at N = 500). Only clusterings with 2 <= K <= N-1 have a
    silhouette; if none exists (N <= 2) B0 = inf (one cluster). Ties go to the smaller B0. It reads only the
    pseudo-label distances, never group ids. Limit: it always finds at least two clusters when it can, and on
    weakly separated clients it often merges groups (see the module's table); ``strict`` and ``auto`` do not.

    Args:
        distances: ``[N, N]`` symmetric client distances.

    Returns:
        B0 as a float.
    """
    b0 = _best_threshold(distances)
    return math.inf if b0 is None else b0


def separated_candidates(d: np.ndarray) -> list[float]:
    """Every threshold t at which the clusters of Algorithm 1 are separated: the connected components of the graph
    ``d <= t`` are cliques. Then Algorithm 1 at B0 = t returns exactly those components, and every within-cluster
    distance (<= t) is below every between-cluster one (> t); conversely a separated clustering is the component
    set at t = its farthest within-cluster distance. One pass over the sorted distances with union-find, counting
    each component's edges against size (size - 1) / 2: exact for any N, O(N^2 log N), at most N - 1 candidates
    with 2 <= K <= N - 1."""
    n = d.shape[0]
    iu = np.triu_indices(n, k=1)
    values = d[iu]
    order = np.argsort(values, kind="stable")
    parent = list(range(n))
    size = [1] * n
    edges = [0] * n
    not_clique = 0  # components whose edges are fewer than size (size - 1) / 2

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    out = []
    components = n
    pos = 0
    while pos < len(order):
        t = values[order[pos]]
        while pos < len(order) and values[order[pos]] == t:  # every edge of one distance at once (ties)
            k = order[pos]
            a, b = find(int(iu[0][k])), find(int(iu[1][k]))
            if a != b:
                for r in (a, b):
                    not_clique -= edges[r] < size[r] * (size[r] - 1) // 2
                if size[a] < size[b]:
                    a, b = b, a
                parent[b] = a
                size[a] += size[b]
                edges[a] += edges[b] + 1
                components -= 1
                not_clique += edges[a] < size[a] * (size[a] - 1) // 2
            else:
                was = edges[a] < size[a] * (size[a] - 1) // 2
                edges[a] += 1
                not_clique -= was and not edges[a] < size[a] * (size[a] - 1) // 2
            pos += 1
        if not_clique == 0 and 2 <= components <= n - 1:
            out.append(float(t))
    return out


def separated_threshold(distances: np.ndarray) -> float:
    """The ``strict`` rule for B0 (no cluster unless every cluster is separated): the best silhouette among the
    Algorithm 1 clusterings whose clusters are separated
    (every within-cluster distance below every between-cluster distance, :attr:`Structure.separated`), if that
    silhouette reaches :data:`WEAK_SILHOUETTE`; otherwise 0, every client alone (only identical clients share a
    cluster).

    A cluster that mixes clients of two distributions gives its teacher the mean of disagreeing pseudo-labels, and
    it scores far below local-only; a client alone costs a few points (its teacher learns from its own
    pseudo-labels on U). So the rule merges clients only where the distances show groups clearly, and a run
    reports the fallback as weak structure (:attr:`Structure.weak`). The separated clusterings are found exactly
    (:func:`separated_candidates`, at most N - 1 of them, for any N); ties go to the smaller B0. N <= 2: B0 = inf
    (one cluster), as the silhouette rule. It reads only the pseudo-label distances. Limit: separation is over the
    whole federation, so when the within-group and between-group distance ranges overlap even for one pair (more
    likely with more clients: Fashion-MNIST at 20 and 40 clients, 5 groups of 100 at 0.1-0.6 within and 0.5-1.2
    between) every client is left alone, where ``auto`` keeps the clusters the uploads support.

    Args:
        distances: ``[N, N]`` symmetric client distances.

    Returns:
        B0 as a float.
    """
    d = np.asarray(distances, dtype=float)
    if d.shape[0] <= 2:
        return math.inf
    best, best_b0 = -np.inf, None
    for t in separated_candidates(d):
        sil = structure(d, greedy_labels(d, t)).silhouette
        if sil is not None and sil > best + 1e-12:
            best, best_b0 = sil, t
    return best_b0 if best_b0 is not None and best >= WEAK_SILHOUETTE else 0.0


#: The named rules of :func:`resolve_b0`.
RULES: dict[str, Callable[[np.ndarray], float]] = {
    "strict": separated_threshold, "silhouette": silhouette_threshold, "otsu": otsu_threshold,
    "inf": lambda _: math.inf}


def resolve_b0(b0: B0, distances: np.ndarray) -> float:
    """A configured threshold B0 as a float: a number >= 0, ``"inf"`` (one cluster), ``"strict"``
    (:func:`separated_threshold`), ``"silhouette"`` (:func:`silhouette_threshold`) or ``"otsu"``
    (:func:`otsu_threshold`). The default ``auto`` chooses no threshold (:func:`cosmos_pl.clustering.cluster_clients`).

    Raises:
        ValueError: an unknown string or a negative number, naming the value and the fix.
    """
    if isinstance(b0, str):
        if b0 not in RULES:
            raise ValueError(f"b0={b0!r}: a threshold rule is a number >= 0, 'inf', 'strict' (separated clusters, "
                             "best silhouette), 'silhouette' or 'otsu' ('auto' uses no threshold: cluster_clients)")
        return RULES[b0](distances)
    b0 = float(b0)
    if math.isnan(b0) or b0 < 0:
        raise ValueError(f"b0={b0}: the threshold must be >= 0")
    return float(b0)

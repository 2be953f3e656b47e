"""Rules that choose the threshold B0 of Algorithm 1 from the client distances alone (never from group ids,
pitfall 3): ``auto`` (best silhouette), ``otsu``, ``inf``, or a number."""

from __future__ import annotations

import math
from typing import Literal, Optional, Union

import numpy as np

from cosmos_pl.clustering.greedy import greedy_labels

__all__ = ["otsu_threshold", "silhouette_threshold", "silhouette", "resolve_b0", "B0", "EXHAUSTIVE_CANDIDATES"]

B0 = Union[float, Literal["auto", "otsu", "inf"]]

# ``auto`` tries every distinct distance while there are at most this many (N <= 64 clients); above, it searches
# coarse to fine (see silhouette_threshold).
EXHAUSTIVE_CANDIDATES = 2048
_GRID = 256


def silhouette(distances: np.ndarray, labels: np.ndarray) -> float:
    """Mean silhouette (Rousseeuw, 1987) of ``labels`` ``[N]`` on a precomputed ``[N, N]`` distance matrix, as
    ``sklearn.metrics.silhouette_score(..., metric="precomputed")`` defines it (a client alone in its cluster
    scores 0), in O(N^2).

    Raises:
        ValueError: fewer than 2 or more than N - 1 clusters (the silhouette is undefined).
    """
    n = len(labels)
    counts = np.bincount(labels)
    k = len(counts)
    if not 2 <= k <= n - 1:
        raise ValueError(f"the silhouette needs 2 <= K <= N - 1 clusters, got K={k} for N={n}")
    order = np.argsort(labels, kind="stable")
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    sums = np.add.reduceat(distances[:, order], starts, axis=1)  # [N, K]: distance from each client to each cluster
    rows = np.arange(n)
    with np.errstate(divide="ignore", invalid="ignore"):
        intra = sums[rows, labels] / (counts[labels] - 1)
        means = sums / counts
        means[rows, labels] = np.inf
        inter = means.min(axis=1)
        s = (inter - intra) / np.maximum(intra, inter)
    return float(np.nan_to_num(s).mean())


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


def silhouette_threshold(distances: np.ndarray) -> float:
    """The ``auto`` rule for B0: the threshold whose Algorithm 1 clustering has the best silhouette score.

    Candidates are the distinct off-diagonal distances (Algorithm 1's result changes only there). With at most
    :data:`EXHAUSTIVE_CANDIDATES` of them (N <= 64) every one is tried. Above that (N(N-1)/2 would mean ~10^5
    clusterings at N = 500) the search goes coarse to fine: 256 candidates spread evenly over the sorted distinct
    distances, then again between the best one's neighbours, until the interval holds at most 256 distances,
    which are all tried (about 600 clusterings at N = 500). Only clusterings with 2 <= K <= N-1 have a
    silhouette; if none exists (N <= 2) B0 = inf (one cluster). Ties go to the smaller B0. It reads only the
    pseudo-label distances, never group ids (pitfall 3). Limit: it always finds at least two clusters when it
    can, so for clients with no group structure pass a number.

    Args:
        distances: ``[N, N]`` symmetric client distances.

    Returns:
        B0 as a float.
    """
    d = np.asarray(distances, dtype=float)
    values = np.unique(d[np.triu_indices(d.shape[0], k=1)])
    seen: dict[bytes, Optional[float]] = {}
    best, best_b0 = -np.inf, math.inf

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


def resolve_b0(b0: B0, distances: np.ndarray) -> float:
    """A configured B0 as a float: a number >= 0, ``"inf"`` (one cluster), ``"auto"`` (:func:`silhouette_threshold`)
    or ``"otsu"`` (:func:`otsu_threshold`).

    Raises:
        ValueError: an unknown string or a negative number, naming the value and the fix.
    """
    if isinstance(b0, str):
        rules = {"auto": silhouette_threshold, "otsu": otsu_threshold, "inf": lambda _: math.inf}
        if b0 not in rules:
            raise ValueError(f"b0={b0!r}: give a number >= 0, 'inf', 'auto' (silhouette rule) or 'otsu'")
        return rules[b0](distances)
    b0 = float(b0)
    if math.isnan(b0) or b0 < 0:
        raise ValueError(f"b0={b0}: the threshold must be >= 0")
    return float(b0)

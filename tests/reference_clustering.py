"""The clustering code as it was before it was made to scale (O(N^2) clusterings for ``auto``, an ``[N, n, M]``
difference tensor per client): kept verbatim as the reference the fast implementation must agree with (tests only)."""

from __future__ import annotations

import math
from typing import Literal, Union

import numpy as np
import torch

from cosmos_pl.errors import DataError, DivergenceError


B0 = Union[float, Literal["auto", "otsu", "inf"]]


def pairwise_distances(pseudo_labels: torch.Tensor, metric: Literal["l1", "l2"] = "l1") -> np.ndarray:
    """Client distance matrix from uploaded pseudo-labels.

    ``l1`` (the paper's, Section 4.1): ``d(i, j) = (1/n) sum_{x in U} ||f_i(x) - f_j(x)||_1``, the L1
    distance of the ``[n, M]`` pseudo-label matrices divided by n, so it lies in [0, 2] whatever |U| is.
    ``l2`` (a named alternative to the paper's L1): ``(1/n) sum_x ||f_i(x) - f_j(x)||_2``.

    Args:
        pseudo_labels: ``[N, n, M]`` float, each row a distribution over M classes.
        metric: "l1" (default) or "l2".

    Returns:
        float64 ``[N, N]``, symmetric, zero diagonal, finite and non-negative.

    Raises:
        ValueError: wrong rank or unknown metric.
        DataError: n = 0 (an empty public set U: the distance is a mean over U, undefined on none).
        DivergenceError: a client's pseudo-labels hold NaN or inf (naming the clients).
    """
    if pseudo_labels.dim() != 3:
        raise ValueError(f"pseudo_labels must be [N, n, M], got shape {tuple(pseudo_labels.shape)}")
    if metric not in ("l1", "l2"):
        raise ValueError(f"distance={metric!r}: use 'l1' (paper) or 'l2'")
    if pseudo_labels.shape[1] == 0:
        raise DataError("the public set U is empty (pseudo-labels [N, 0, M]): client distances are means over U and "
                        "undefined without it; set data.public_fraction > 0 (U needs at least 2 samples)")
    bad = (~torch.isfinite(pseudo_labels)).flatten(1).any(dim=1).nonzero().flatten().tolist()
    if bad:
        raise DivergenceError(f"client(s) {bad} uploaded pseudo-labels holding NaN or inf: they cannot be clustered; "
                              "their training diverged (lower the learning rate or check the data)")
    p = pseudo_labels.double()
    n_clients, n = p.shape[0], p.shape[1]
    out = np.zeros((n_clients, n_clients))
    for i in range(n_clients):
        diff = p[i + 1 :] - p[i]  # [N-i-1, n, M]
        per_sample = diff.abs().sum(-1) if metric == "l1" else diff.norm(dim=-1)
        d = (per_sample.sum(-1) / n).numpy()
        out[i, i + 1 :] = d
        out[i + 1 :, i] = d
    return out


def greedy_clustering(distances: np.ndarray, b0: float) -> list[list[int]]:
    """Algorithm 1 of the COSMOS paper.

    With C the unassigned clients, repeat until C is empty: pick ``i* = argmax_{i in C} |N_i(B0, C)|`` where
    ``N_i(B0, C) = {j in C \\ {i} : d(i, j) <= B0}``, ties broken by the lowest client index; form the cluster
    ``{i*} u N_i*(B0, C)`` and remove it from C.

    Args:
        distances: ``[N, N]`` symmetric client distances.
        b0: the threshold B0 >= 0 (``math.inf`` puts every client in one cluster; 0 groups only identical clients).

    Returns:
        The clusters in the order formed, each a sorted list of client indices; K = len(result).

    Raises:
        ValueError: b0 < 0 or NaN, or a non-square matrix.
    """
    d = np.asarray(distances, dtype=float)
    if d.ndim != 2 or d.shape[0] != d.shape[1]:
        raise ValueError(f"distances must be a square [N, N] matrix, got shape {d.shape}")
    if not b0 >= 0:  # also catches NaN
        raise ValueError(f"b0={b0}: the threshold must be a number >= 0 (or 'auto')")
    close = d <= b0
    np.fill_diagonal(close, False)
    remaining = list(range(d.shape[0]))
    clusters: list[list[int]] = []
    while remaining:
        sub = close[np.ix_(remaining, remaining)]
        counts = sub.sum(axis=1)
        pos = int(np.argmax(counts))  # np.argmax returns the first maximum: lowest index wins ties
        members = [remaining[pos]] + [remaining[j] for j in np.flatnonzero(sub[pos])]
        clusters.append(sorted(members))
        taken = set(members)
        remaining = [c for c in remaining if c not in taken]
    return clusters


def otsu_threshold(distances: np.ndarray) -> float:
    """The ``otsu`` rule for B0: Otsu's threshold on the off-diagonal pairwise distances.

    The N(N-1)/2 distances are split into a "close" and a "far" class at the cut that maximizes the
    between-class variance (Otsu, 1979); B0 is the midpoint between the largest close and the smallest far
    distance. It reads only the pseudo-label distances, never group ids (a server cannot know them). When every
    distance is equal there is no cut and B0 = that distance (one cluster). Limit: it assumes at least two distinct
    levels of similarity; with IID clients it still splits at the widest gap, so pass a number there.

    Args:
        distances: ``[N, N]`` symmetric client distances, N >= 2.

    Returns:
        B0 as a float.
    """
    d = np.asarray(distances, dtype=float)
    iu = np.triu_indices(d.shape[0], k=1)
    values = np.sort(d[iu])
    if values.size == 0:
        return 0.0
    if values[0] == values[-1]:
        return float(values[0])
    best_score, best_cut = -1.0, 1
    total = values.sum()
    cumsum = np.cumsum(values)
    m = values.size
    for cut in range(1, m):  # close = values[:cut], far = values[cut:]
        if values[cut - 1] == values[cut]:
            continue  # never split equal values
        w0, w1 = cut / m, (m - cut) / m
        mu0 = cumsum[cut - 1] / cut
        mu1 = (total - cumsum[cut - 1]) / (m - cut)
        score = w0 * w1 * (mu0 - mu1) ** 2
        if score > best_score:
            best_score, best_cut = score, cut
    return float((values[best_cut - 1] + values[best_cut]) / 2)


def silhouette_threshold(distances: np.ndarray) -> float:
    """The ``auto`` rule for B0: the threshold whose Algorithm 1 clustering has the best silhouette score.

    Every distinct off-diagonal distance is tried as B0; Algorithm 1 is run for each, and the clustering
    with the highest mean silhouette (Rousseeuw, 1987) on the same distance matrix wins (ties: the smaller
    B0). Only clusterings with 2 <= K <= N-1 have a silhouette; if none exists (N <= 2) B0 = inf (one
    cluster). It reads only the pseudo-label distances, never group ids (a server cannot know them). Limit: it always
    finds at least two clusters when it can, so for clients with no group structure pass a number.

    Args:
        distances: ``[N, N]`` symmetric client distances.

    Returns:
        B0 as a float.
    """
    from sklearn.metrics import silhouette_score

    d = np.asarray(distances, dtype=float)
    n = d.shape[0]
    best, best_b0 = -np.inf, math.inf
    for b0 in np.unique(d[np.triu_indices(n, k=1)]):
        clusters = greedy_clustering(d, float(b0))
        if not 2 <= len(clusters) <= n - 1:
            continue
        labels = np.empty(n, dtype=int)
        for k, members in enumerate(clusters):
            labels[members] = k
        score = silhouette_score(d, labels, metric="precomputed")
        if score > best + 1e-12:
            best, best_b0 = score, float(b0)
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

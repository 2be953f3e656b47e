"""COSMOS Algorithm 1: greedy threshold clustering of clients by pseudo-label distance."""

from __future__ import annotations

import numpy as np

__all__ = ["greedy_clustering", "greedy_labels"]


def _check(distances: np.ndarray, b0: float) -> np.ndarray:
    d = np.asarray(distances, dtype=float)
    if d.ndim != 2 or d.shape[0] != d.shape[1]:
        raise ValueError(f"distances must be a square [N, N] matrix, got shape {d.shape}")
    if not b0 >= 0:  # also catches NaN
        raise ValueError(f"b0={b0}: the threshold must be a number >= 0 (or 'auto')")
    return d


def _greedy(close: np.ndarray) -> list[np.ndarray]:
    """Algorithm 1 on a boolean ``[N, N]`` neighbour matrix with a False diagonal.

    Neighbour counts within the unassigned clients C are kept up to date by subtracting the columns of each
    cluster as it is removed, so a whole run costs O(N^2) instead of O(K N^2).
    """
    n = close.shape[0]
    counts = close.sum(axis=1).astype(np.int64)
    alive = np.ones(n, dtype=bool)
    clusters = []
    while alive.any():
        pos = int(np.argmax(np.where(alive, counts, -1)))  # first maximum: the lowest index wins ties
        members = np.flatnonzero(close[pos] & alive)
        members = np.sort(np.append(members, pos))
        alive[members] = False
        counts -= close[:, members].sum(axis=1)
        clusters.append(members)
    return clusters


def greedy_clustering(distances: np.ndarray, b0: float) -> list[list[int]]:
    """Algorithm 1 of the COSMOS paper.

    With C the unassigned clients, repeat until C is empty: pick ``i* = argmax_{i in C} |N_i(B0, C)|`` where
    ``N_i(B0, C) = {j in C \\ {i} : d(i, j) <= B0}``, ties broken by the lowest client index; form the cluster
    ``{i*} u N_i*(B0, C)`` and remove it from C. O(N^2) time.

    Args:
        distances: ``[N, N]`` symmetric client distances.
        b0: the threshold B0 >= 0 (``math.inf`` puts every client in one cluster; 0 groups only identical clients).

    Returns:
        The clusters in the order formed, each a sorted list of client indices; K = len(result).

    Raises:
        ValueError: b0 < 0 or NaN, or a non-square matrix.
    """
    d = _check(distances, b0)
    close = d <= b0
    np.fill_diagonal(close, False)
    return [c.tolist() for c in _greedy(close)]


def greedy_labels(distances: np.ndarray, b0: float) -> np.ndarray:
    """Algorithm 1's clustering as labels ``[N]`` (cluster k = the k-th cluster formed)."""
    d = _check(distances, b0)
    close = d <= b0
    np.fill_diagonal(close, False)
    labels = np.empty(d.shape[0], dtype=np.int64)
    for k, members in enumerate(_greedy(close)):
        labels[members] = k
    return labels

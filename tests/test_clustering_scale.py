"""The server steps at scale agree with the implementation they replaced (tests/reference_clustering.py).

At scale: no ``[N, n, M]`` difference tensor, and ``auto`` B0 without one Algorithm 1 run per distinct distance.
On small N the new code must give the same distances (to float32 rounding), the same B0 and the same clusters.
"""

import numpy as np
import pytest
import torch
from sklearn.metrics import silhouette_score

import reference_clustering as ref
from cosmos_pl.clustering import (
    greedy_clustering, greedy_labels, native, otsu_threshold, pairwise_distances, silhouette, silhouette_threshold,
)
from cosmos_pl.clustering import distances as distances_module
from cosmos_pl.clustering import threshold as threshold_module


def _uploads(n_clients, n, m, groups, seed, sharp=3.0):
    """Softmax pseudo-labels [N, n, M] with planted groups (clients of a group share logits plus noise)."""
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(groups, n, m, generator=g) * sharp
    logits = torch.stack([centres[i % groups] + torch.randn(n, m, generator=g) for i in range(n_clients)])
    return logits.softmax(-1)


@pytest.mark.parametrize("metric", ["l1", "l2"])
def test_distances_equal_the_reference(metric):
    p = _uploads(9, 37, 5, groups=3, seed=0)
    assert np.allclose(pairwise_distances(p, metric), ref.pairwise_distances(p, metric), rtol=1e-6, atol=1e-7)


def test_torch_fallback_equals_the_compiled_kernel(monkeypatch):
    p = _uploads(11, 300, 7, groups=2, seed=1)
    fast = pairwise_distances(p)
    monkeypatch.setattr(native, "l1_upper", lambda x: None)  # as on a machine without a C compiler
    monkeypatch.setattr(distances_module, "_L1_TORCH_CHUNK", 64)  # several chunks, a ragged last one
    slow = pairwise_distances(p)
    assert np.allclose(fast, slow, rtol=1e-6, atol=1e-7)
    assert np.allclose(slow, ref.pairwise_distances(p), rtol=1e-6, atol=1e-7)


def test_compiled_kernel_by_hand():
    if native.load() is None:
        pytest.skip("no C compiler on this machine: the torch path is tested above")
    # rows [0, 1, 2, 3, ...] and shifted copies: |x_i - x_j| summed over 1,031 columns (not a multiple of 8)
    x = np.stack([np.arange(1031, dtype=np.float32) + s for s in (0.0, 0.5, 2.0, -1.0, 0.25)])
    upper = native.l1_upper(x)
    shifts = [0.0, 0.5, 2.0, -1.0, 0.25]
    for i in range(5):
        for j in range(5):
            expected = 1031 * abs(shifts[i] - shifts[j]) if j > i else 0.0
            assert upper[i, j] == pytest.approx(expected, rel=1e-6)


def test_identical_clients_are_at_distance_zero():
    p = _uploads(3, 50, 4, groups=1, seed=2)
    p[2] = p[0]
    d = pairwise_distances(p)
    assert d[0, 2] == 0.0 and d[2, 0] == 0.0
    assert greedy_clustering(d, 0.0) == [[0, 2], [1]]


@pytest.mark.parametrize("seed", range(6))
def test_algorithm1_equals_the_reference(seed):
    rng = np.random.default_rng(seed)
    n = 30
    a = rng.random((n, n))
    d = np.round(a + a.T, 1)  # coarse values: many ties in the neighbour counts
    np.fill_diagonal(d, 0)
    for b0 in (0.0, 0.3, 0.7, 1.1, 1.5, 2.0, float("inf")):
        assert greedy_clustering(d, b0) == ref.greedy_clustering(d, b0)
        labels = greedy_labels(d, b0)
        for k, members in enumerate(ref.greedy_clustering(d, b0)):
            assert (labels[members] == k).all()


@pytest.mark.parametrize("seed", range(4))
def test_silhouette_equals_sklearn(seed):
    rng = np.random.default_rng(seed)
    a = rng.random((25, 25))
    d = a + a.T
    np.fill_diagonal(d, 0)
    labels = rng.integers(0, 4, 25)
    labels[0] = 5  # a singleton cluster scores 0 (and an empty label 4 is allowed)
    labels = np.unique(labels, return_inverse=True)[1]
    assert silhouette(d, labels) == pytest.approx(silhouette_score(d, labels, metric="precomputed"), abs=1e-12)


@pytest.mark.parametrize("seed", range(5))
def test_auto_and_otsu_equal_the_reference_on_small_n(seed):
    p = _uploads(12 + 4 * seed, 40, 6, groups=2 + seed % 3, seed=seed, sharp=1.0 + seed)
    d = pairwise_distances(p)
    d_ref = ref.pairwise_distances(p)
    b0, b0_ref = silhouette_threshold(d), ref.silhouette_threshold(d_ref)
    assert b0 == pytest.approx(b0_ref, rel=1e-6)
    assert greedy_clustering(d, b0) == ref.greedy_clustering(d_ref, b0_ref)
    assert otsu_threshold(d) == ref.otsu_threshold(d)


def test_coarse_to_fine_search_finds_the_exhaustive_optimum(monkeypatch):
    """Above EXHAUSTIVE_CANDIDATES distinct distances the search is coarse to fine; on planted groups it must
    land on the same clustering as trying every distance (forced here on N = 60 by lowering the limit)."""
    p = _uploads(60, 30, 5, groups=4, seed=7, sharp=2.0)
    d = pairwise_distances(p)
    exhaustive = ref.silhouette_threshold(d)
    monkeypatch.setattr(threshold_module, "EXHAUSTIVE_CANDIDATES", 100)
    monkeypatch.setattr(threshold_module, "_GRID", 16)
    searched = silhouette_threshold(d)
    assert greedy_clustering(d, searched) == greedy_clustering(d, exhaustive)
    assert sorted(map(sorted, greedy_clustering(d, searched))) == [list(range(k, 60, 4)) for k in range(4)]

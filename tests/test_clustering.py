"""Algorithm 1 and the client distance on hand-made matrices (COSMOS paper, Section 4.1)."""

import math

import numpy as np
import pytest
import torch

from cosmos_pl.clustering import (
    cluster_clients,
    greedy_clustering,
    otsu_threshold,
    pairwise_distances,
    resolve_b0,
    silhouette_threshold,
)

# A chain 0-1-2-3 with neighbouring distance 0.1, everything else 0.9.
CHAIN = np.full((4, 4), 0.9)
np.fill_diagonal(CHAIN, 0.0)
for a, b in [(0, 1), (1, 2), (2, 3)]:
    CHAIN[a, b] = CHAIN[b, a] = 0.1


def test_l1_distance_per_public_sample_by_hand():
    f0 = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    f1 = torch.tensor([[0.0, 1.0], [0.0, 1.0]])
    f2 = torch.tensor([[0.5, 0.5], [0.5, 0.5]])
    d = pairwise_distances(torch.stack([f0, f1, f2]))
    # sample 0: |1-0|+|0-1| = 2, sample 1: 0  -> (2 + 0) / n=2 = 1.0
    assert d[0, 1] == pytest.approx(1.0)
    # f0 vs f2: 1.0 per sample -> 1.0 ; f1 vs f2: sample0 1.0, sample1 1.0 -> 1.0
    assert d[0, 2] == pytest.approx(1.0) and d[1, 2] == pytest.approx(1.0)
    assert np.allclose(d, d.T) and np.all(np.diag(d) == 0)


def test_l1_hard_counts_the_public_samples_labelled_differently_by_hand():
    f0 = torch.tensor([[1.0, 0.0], [0.0, 1.0]])  # labels 0, 1
    f1 = torch.tensor([[0.0, 1.0], [0.0, 1.0]])  # 1, 1
    f2 = torch.tensor([[0.5, 0.5], [0.4, 0.6]])  # 0 (a tie goes to the lower class), 1
    f3 = torch.tensor([[0.9, 0.1], [0.45, 0.55]])  # 0, 1: soft 0.8 + 0.9 from f0, but the same labels
    d = pairwise_distances(torch.stack([f0, f1, f2, f3]), "l1_hard")
    # one of two samples labelled differently: 2 * 1/2 = 1.0; none: 0
    assert d[0, 1] == pytest.approx(1.0) and d[0, 2] == 0 and d[1, 2] == pytest.approx(1.0) and d[0, 3] == 0
    assert pairwise_distances(torch.stack([f0, f3]))[0, 1] == pytest.approx((0.2 + 0.9) / 2)  # soft differs
    assert np.allclose(d, d.T) and np.all(np.diag(d) == 0)


def test_l2_is_a_named_alternative():
    f0 = torch.tensor([[1.0, 0.0]])
    f1 = torch.tensor([[0.0, 1.0]])
    d = pairwise_distances(torch.stack([f0, f1]), "l2")
    assert d[0, 1] == pytest.approx(math.sqrt(2))
    with pytest.raises(ValueError, match="distance"):
        pairwise_distances(torch.stack([f0, f1]), "cosine")


def test_greedy_picks_most_neighbours_first():
    d = np.array([[0, .1, .5, .9], [.1, 0, .2, .9], [.5, .2, 0, .3], [.9, .9, .3, 0]])
    # B0=0.25: neighbours 0:{1} 1:{0,2} 2:{1} 3:{} -> client 1 first with {0,2}; then {3}
    assert greedy_clustering(d, 0.25) == [[0, 1, 2], [3]]


def test_ties_broken_by_lowest_index():
    # B0=0.15 on the chain: counts [1,2,2,1]; clients 1 and 2 tie -> 1 wins -> {0,1,2}, then {3}.
    assert greedy_clustering(CHAIN, 0.15) == [[0, 1, 2], [3]]
    pairs = np.full((4, 4), 0.9)
    np.fill_diagonal(pairs, 0)
    pairs[0, 1] = pairs[1, 0] = pairs[2, 3] = pairs[3, 2] = 0.1
    assert greedy_clustering(pairs, 0.2) == [[0, 1], [2, 3]]


def test_b0_zero_and_infinity():
    assert greedy_clustering(CHAIN, 0.0) == [[0], [1], [2], [3]]
    assert greedy_clustering(CHAIN, math.inf) == [[0, 1, 2, 3]]
    same = np.zeros((3, 3))
    same[0, 2] = same[2, 0] = same[1, 2] = same[2, 1] = 1.0
    assert greedy_clustering(same, 0.0) == [[0, 1], [2]]  # identical clients 0,1 are B0-close at B0=0


def test_neighbours_counted_only_among_unassigned():
    # after {0,1,2} is formed client 3 has no neighbours left even though d(2,3) <= B0
    assert greedy_clustering(CHAIN, 0.15)[1] == [3]


def test_bad_b0_is_rejected():
    with pytest.raises(ValueError, match="b0="):
        greedy_clustering(CHAIN, -1.0)
    with pytest.raises(ValueError, match="b0="):
        greedy_clustering(CHAIN, float("nan"))
    with pytest.raises(ValueError, match="'strict'"):
        resolve_b0("kmeans", CHAIN)
    with pytest.raises(ValueError, match="'auto' uses no threshold"):
        resolve_b0("auto", CHAIN)
    with pytest.raises(ValueError, match="b0="):
        resolve_b0(-0.5, CHAIN)


def test_otsu_threshold_by_hand():
    d = np.zeros((4, 4))
    vals = {(0, 1): 0.1, (2, 3): 0.1, (0, 2): 0.2, (0, 3): 0.9, (1, 2): 0.9, (1, 3): 1.0}
    for (a, b), v in vals.items():
        d[a, b] = d[b, a] = v
    # sorted 0.1 0.1 0.2 | 0.9 0.9 1.0: the between-class variance is largest at this cut
    assert otsu_threshold(d) == pytest.approx((0.2 + 0.9) / 2)
    assert resolve_b0("otsu", d) == pytest.approx(0.55)
    assert resolve_b0(0.3, d) == 0.3
    assert resolve_b0("inf", d) == math.inf


def test_the_rules_recover_planted_groups_from_pseudo_labels_only():
    rng = np.random.default_rng(0)
    groups = np.repeat(np.arange(3), 4)  # 12 clients in 3 groups
    centers = rng.dirichlet(np.ones(5), size=(3, 50))  # [group, n, M]
    labels = []
    for g in groups:
        noisy = centers[g] + rng.uniform(0, 0.05, size=centers[g].shape)
        labels.append(noisy / noisy.sum(1, keepdims=True))
    d = pairwise_distances(torch.tensor(np.stack(labels)))
    clusters = greedy_clustering(d, resolve_b0("strict", d))
    assert sorted(clusters) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    assert cluster_clients("auto", d).clusters == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]


def test_silhouette_rule_by_hand():
    # two tight pairs far apart: candidates 0.1 (K=2: {0,1},{2,3}) and 0.9 (K=1, no silhouette).
    pairs = np.full((4, 4), 0.9)
    np.fill_diagonal(pairs, 0)
    pairs[0, 1] = pairs[1, 0] = pairs[2, 3] = pairs[3, 2] = 0.1
    assert silhouette_threshold(pairs) == pytest.approx(0.1)
    assert greedy_clustering(pairs, resolve_b0("strict", pairs)) == [[0, 1], [2, 3]]
    assert cluster_clients("auto", pairs).clusters == [[0, 1], [2, 3]]
    assert silhouette_threshold(np.array([[0.0, 1.0], [1.0, 0.0]])) == math.inf  # N=2: no silhouette, one cluster


def test_silhouette_rule_finds_a_gap_that_otsu_misses():
    # 3 groups of 3: within-group distances spread widely (0.3-1.0), between-group ones bunched (1.1-1.3).
    rng = np.random.default_rng(3)
    groups = np.repeat(np.arange(3), 3)
    d = np.zeros((9, 9))
    for i in range(9):
        for j in range(i + 1, 9):
            d[i, j] = d[j, i] = rng.uniform(0.3, 1.0) if groups[i] == groups[j] else rng.uniform(1.1, 1.3)
    found = greedy_clustering(d, resolve_b0("strict", d))
    assert sorted(found) == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    assert cluster_clients("auto", d).clusters == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]

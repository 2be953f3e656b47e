"""The keep rule of ``b0: auto``: a cut is kept where its mean silhouette beats the same distances shuffled
(cosmos_pl/clustering/chance.py). The bounds below are worked out by hand: s = (b - a) / max(a, b), a the mean
distance to the client's own cluster, b the smallest mean distance to another; 0 for a client alone."""

import numpy as np
import pytest

from cosmos_pl.clustering import cluster_clients, silhouettes
from cosmos_pl.clustering.chance import NULL_CLIENTS, ChanceTest, chance_test


def _loose(groups: int = 4, size: int = 5) -> tuple[np.ndarray, np.ndarray]:
    g = np.repeat(np.arange(groups), size)
    d = np.where(g[:, None] == g[None, :], 0.85, 1.0)
    np.fill_diagonal(d, 0.0)
    return d, g


def test_the_p_value_counts_the_shuffles_at_or_above_the_data():
    assert ChanceTest(0.3, (0.1, 0.3, 0.5), 0.05).p_value == pytest.approx((1 + 2) / 4)  # 0.3 and 0.5 reach it
    assert ChanceTest(0.6, (0.1,) * 19, 0.05).p_value == pytest.approx(1 / 20)
    assert ChanceTest(0.6, (0.1,) * 19, 0.05).beats_chance
    assert not ChanceTest(0.6, (0.1,) * 18 + (0.6,), 0.05).beats_chance  # a tie counts against: 2 / 20
    with pytest.raises(ValueError, match="shuffles=0: give at least 1"):
        chance_test(np.zeros((3, 3)), 0.5, lambda d: 0.0, shuffles=0)
    with pytest.raises(ValueError, match=r"alpha=1.5: must lie in \(0, 1\]"):
        chance_test(np.zeros((3, 3)), 0.5, lambda d: 0.0, alpha=1.5)


def test_a_loose_group_far_tighter_than_chance_is_kept():
    # four groups of five, 0.85 apart inside and 1.0 between: every client has a = 0.85, b = 1.0, s = 0.15, below the
    # 0.2 the earlier rule asked for. In a shuffle of these 190 distances every client still has a >= 0.85 and
    # b <= 1.0, so s <= 0.15, with equality only where every cluster's distances are all 0.85 and all others 1.0,
    # i.e. where the shuffle rebuilt four cliques of five from the forty 0.85s: no shuffle reaches the data; with 20
    # clients the test runs 199 shuffles, so p = 1/200.
    d, g = _loose()
    assert silhouettes(d, g) == pytest.approx([0.15] * 20)
    found = cluster_clients("auto", d)
    assert found.clusters == [list(range(k, k + 5)) for k in range(0, 20, 5)]
    assert found.tests[0][1] == pytest.approx(0.15) and found.tests[0][2] == pytest.approx(1 / 200)
    assert cluster_clients("silhouette_floor", d).clusters == [[i] for i in range(20)]  # the floor dissolved them


def test_the_same_distances_with_the_groups_shuffled_are_mostly_not_kept():
    # the forty 0.85s of the loose groups on random pairs: no group in them. Where the cut is not kept every client is
    # alone. The shuffles search cuts of at most the data's K while the data's cut won over every K, so the test
    # keeps such matrices more often than its level 0.05: measured, 4 of 20 (seeds 100-119), 3 of these 10.
    d, _ = _loose()
    upper = np.triu_indices(20, 1)
    kept = 0
    for seed in range(10):
        shuffled = np.zeros((20, 20))
        shuffled[upper] = np.random.default_rng(100 + seed).permutation(d[upper])
        shuffled += shuffled.T
        found = cluster_clients("auto", shuffled)
        if found.tests[0][2] <= 0.05:
            kept += 1
        else:
            assert found.clusters == [[i] for i in range(20)]
    assert kept <= 3


def test_above_null_clients_each_shuffle_permutes_a_random_subset_and_the_same_input_gives_the_same_null():
    n = NULL_CLIENTS + 50
    rng = np.random.default_rng(0)
    d = rng.random((n, n))
    d = np.triu(d, 1) + np.triu(d, 1).T
    seen: list[np.ndarray] = []

    def record(m: np.ndarray) -> float:
        seen.append(m.copy())
        return float(m[0, 1])

    test = chance_test(d, 0.5, record, shuffles=3)
    assert [m.shape for m in seen] == [(NULL_CLIENTS, NULL_CLIENTS)] * 3
    for m in seen:
        assert np.array_equal(m, m.T) and np.all(np.diag(m) == 0)
        # its values are those of some NULL_CLIENTS rows and columns of d: every one is a value of d
        assert np.isin(m[np.triu_indices(NULL_CLIENTS, 1)], d[np.triu_indices(n, 1)]).all()
    assert test.null == tuple(float(m[0, 1]) for m in seen)
    assert chance_test(d, 0.5, lambda m: float(m[0, 1]), shuffles=3).null == test.null

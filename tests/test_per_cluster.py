"""The default rule, ``b0: auto`` (cluster by cluster: average linkage, the cut kept where it beats chance, each kept
cluster tested again inside), and ``b0: silhouette_floor`` (the same with each cluster kept on its own silhouette
and persistence), on hand-made distance matrices: one overlapping pair, an outlier, a client nearer another
cluster, two groups whose distances interleave, identical clients. Every silhouette below is worked out by hand:
s = (b - a) / max(a, b), a the mean distance to the client's own cluster, b the smallest mean distance to another.
The chance tests themselves are in tests/test_chance.py."""

import numpy as np
import pytest

from cosmos_pl.clustering import FLOOR, cluster_clients, per_cluster_clustering, silhouette, silhouettes, structure
from cosmos_pl.clustering.per_cluster import PERSISTENCE, PLACEMENT_MARGIN


def _matrix(n: int, rest: float, pairs: dict[tuple[int, int], float]) -> np.ndarray:
    d = np.full((n, n), rest)
    np.fill_diagonal(d, 0.0)
    for (i, j), v in pairs.items():
        d[i, j] = d[j, i] = v
    return d


def _groups(sizes: list[int], within: float) -> dict[tuple[int, int], float]:
    pairs, start = {}, 0
    for size in sizes:
        for i in range(start, start + size):
            for j in range(i + 1, start + size):
                pairs[(i, j)] = within
        start += size
    return pairs


def test_one_overlapping_pair_keeps_the_other_clusters():
    # groups {0,1,2}, {3,4,5}, {6,7,8} 0.2 apart inside, 1.0 between; but 1 and 2 are 0.4 apart and 0 is 0.3 from 3,
    # closer than that: the ranges overlap, so no clustering is separated over the whole federation
    pairs = _groups([3, 3, 3], 0.2)
    pairs[(1, 2)], pairs[(0, 3)] = 0.4, 0.3
    d = _matrix(9, 1.0, pairs)
    assert cluster_clients("strict", d).clusters == [[i] for i in range(9)]  # the earlier default gives up
    found = cluster_clients("auto", d)
    assert found.clusters == [[0, 1, 2], [3, 4, 5], [6, 7, 8]] and found.left == [] and found.dissolved == []
    # client 0: a = 0.2, b = mean(0.3, 1, 1) = 0.7667 -> 0.7391; 1 and 2: a = mean(0.2, 0.4) = 0.3, b = 1 -> 0.7;
    # 3: as 0 (0.7391); 4, 5 and the third group: a = 0.2, b = 1 -> 0.8. Every cluster is far above the floor.
    s = silhouettes(d, found.labels)
    assert s == pytest.approx([(2.3 / 3 - 0.2) / (2.3 / 3), 0.7, 0.7, (2.3 / 3 - 0.2) / (2.3 / 3), 0.8, 0.8, 0.8, 0.8,
                               0.8])
    st = structure(d, found.labels)
    assert not st.separated and not st.weak  # overlapping ranges alone are not weak structure
    assert (st.within_max, st.between_min, st.alone) == (pytest.approx(0.4), pytest.approx(0.3), 0)


def test_an_outlier_stays_alone_while_the_rest_cluster():
    # {0,1,2} and {3,4,5} 0.2 inside and 1.0 apart; client 6 is 0.85 from the first group and 0.9 from the second.
    pairs = _groups([3, 3], 0.2)
    pairs.update({(i, 6): 0.85 for i in range(3)})
    pairs.update({(i, 6): 0.9 for i in range(3, 6)})
    d = _matrix(7, 1.0, pairs)
    # the cut that leaves 6 alone: 0-2 have a = 0.2, b = 0.85 -> 0.7647; 3-5 a = 0.2, b = 0.9 -> 0.7778; 6 scores 0:
    # mean 0.6611. The cut that joins 6 to the first group: 0-2 a = (0.2 + 0.2 + 0.85) / 3 = 0.4167, b = 1 ->
    # 0.5833; 6 a = 0.85, b = 0.9 -> 0.0556; 3-5 a = 0.2, b = 3.9 / 4 -> 0.7949: mean 0.5986. The first starts.
    assert silhouette(d, np.array([0, 0, 0, 1, 1, 1, 2])) == pytest.approx((3 * 0.65 / 0.85 + 3 * 0.7 / 0.9) / 7)
    assert silhouette(d, np.array([0, 0, 0, 1, 1, 1, 0])) == pytest.approx(
        (3 * (1 - 1.25 / 3) + 0.05 / 0.9 + 3 * (0.975 - 0.2) / 0.975) / 7)
    assert cluster_clients("auto", d).clusters == [[0, 1, 2], [3, 4, 5], [6]]


def test_a_client_nearer_another_cluster_on_average_leaves_its_own():
    # 0-2: 0.3, 0-1: 0.5, 1-2: 0.9; {3,4,5}, {6,7,8} and {9,10,11} 0.5 inside; 2 is 0.55 from each of 3-5; every other
    # pair 1.2. Average linkage joins 0 and 2 (0.3), then 1 (mean 0.7 < their mean 0.875 to {3,4,5}): the best cut is
    # the four triples. In it client 2 has a = mean(0.3, 0.9) = 0.6 and b = 0.55: s = -0.0833, it is nearer the other
    # cluster, so it leaves.
    pairs = {(0, 1): 0.5, (0, 2): 0.3, (1, 2): 0.9, (2, 3): 0.55, (2, 4): 0.55, (2, 5): 0.55, **_groups([3, 3, 3, 3], 0.5)}
    pairs[(0, 1)], pairs[(0, 2)], pairs[(1, 2)] = 0.5, 0.3, 0.9
    d = _matrix(12, 1.2, pairs)
    found = per_cluster_clustering(d)
    assert sorted(np.unique(found.start, return_counts=True)[1].tolist()) == [3, 3, 3, 3]
    assert len(set(found.start[:3].tolist())) == 1
    assert silhouettes(d, found.start)[:6] == pytest.approx([(1.2 - 0.4) / 1.2, (1.2 - 0.7) / 1.2, (0.55 - 0.6) / 0.6,
                                                              *[(2.95 / 3 - 0.5) / (2.95 / 3)] * 3])
    assert found.left == [2] and found.tests[0][2] <= 0.05  # the cut beats chance
    assert cluster_clients("auto", d).clusters == [[0, 1], [2], [3, 4, 5], [6, 7, 8], [9, 10, 11]]
    # silhouette_floor: {0, 1} without 2: a = 0.5, b = 1.2 (the start's other clusters) -> 0.5833 >= the floor; it
    # persists: joined at 0.7 (with 2), and that node joins the rest at (6 * 1.2 + 3 * 0.55) / 9 = 0.9833: 1.40
    assert 0.9833 / 0.7 >= PERSISTENCE and (1.2 - 0.5) / 1.2 >= FLOOR
    assert cluster_clients("silhouette_floor", d).clusters == [[0, 1], [2], [3, 4, 5], [6, 7, 8], [9, 10, 11]]


def test_two_groups_whose_distances_interleave_are_not_merged():
    # {0,1,2} and {3,4,5}: all 15 distances in one band 0.70-0.84, within-group pairs taking every third rank, so
    # within and between distances interleave. The best cut is every client but 5 against 5 (mean silhouette
    # 0.0591): client 0 there has a = mean(0.70, 0.73, 0.71, 0.72) = 0.715 and b = 0.74, s = 0.0338; no cluster is
    # kept: under auto the cut does not beat chance (shuffles of these 15 distances make cuts as good), under
    # silhouette_floor the five's mean silhouette 0.0591 < the floor (and it persists 0.802 / 0.775 = 1.03 < 1.2).
    d = np.array([[0.00, 0.70, 0.73, 0.71, 0.72, 0.74],
                  [0.70, 0.00, 0.76, 0.75, 0.77, 0.78],
                  [0.73, 0.76, 0.00, 0.80, 0.81, 0.83],
                  [0.71, 0.75, 0.80, 0.00, 0.79, 0.82],
                  [0.72, 0.77, 0.81, 0.79, 0.00, 0.84],
                  [0.74, 0.78, 0.83, 0.82, 0.84, 0.00]])
    found = per_cluster_clustering(d)
    assert sorted(map(sorted, [np.flatnonzero(found.start == k).tolist() for k in range(2)])) == [[0, 1, 2, 3, 4], [5]]
    s = silhouettes(d, found.start)
    assert s[0] == pytest.approx((0.74 - 0.715) / 0.74) and s[:5].mean() < FLOOR
    assert found.labels.tolist() == list(range(6)) and found.alone_dissolved == [0, 1, 2, 3, 4]
    assert found.tests[0][1] == pytest.approx(silhouettes(d, found.start).mean()) and found.tests[0][2] > 0.05
    floor = per_cluster_clustering(d, keep="floor")
    assert floor.labels.tolist() == list(range(6)) and floor.alone_dissolved == [0, 1, 2, 3, 4]
    # where the threshold rules merge the two groups into one teacher, auto does not
    assert cluster_clients("silhouette", d).clusters == [[0, 1, 2, 3, 4], [5]]
    assert cluster_clients("otsu", d).clusters == [list(range(6))]
    st = structure(d, found.labels)
    assert st.K == st.N and st.weak and st.reasons() == ["no two clients share a cluster (K = N)"]


def test_identical_clients_stay_together_and_no_structure_gives_no_cluster():
    assert per_cluster_clustering(np.zeros((6, 6))).labels.tolist() == [0] * 6  # one upload six times: one teacher
    d = _matrix(4, 0.5, {})  # every pair equally far: no cut has 2 <= K <= 3
    assert per_cluster_clustering(d).labels.tolist() == [0, 1, 2, 3]
    d = _matrix(5, 1.0, {(0, 1): 0.0})  # 0 and 1 identical, everyone else equally far: they share a teacher
    assert cluster_clients("auto", d).clusters == [[0, 1], [2], [3], [4]]
    assert per_cluster_clustering(np.array([[0.0, 1.0], [1.0, 0.0]])).labels.tolist() == [0, 0]  # N = 2: one


def test_bad_settings_are_refused_naming_the_value():
    with pytest.raises(ValueError, match=r"b0='kmeans': give a number >= 0 .* 'auto' .* 'silhouette_floor'"):
        cluster_clients("kmeans", np.zeros((3, 3)))
    with pytest.raises(ValueError, match=r"b0=-0.5: the threshold must be a number >= 0"):
        cluster_clients(-0.5, np.zeros((3, 3)))
    with pytest.raises(ValueError, match="square"):
        per_cluster_clustering(np.zeros((3, 2)))
    with pytest.raises(ValueError, match=r"keep='median': give 'chance' or 'floor'"):
        per_cluster_clustering(np.zeros((3, 3)), keep="median")


def test_uninformative_clients_are_placed_with_the_nearest_informative_client():
    # informative clients 0, 1, 2 (one per group, every pair 1.0 apart); clients 3, 4, 5 upload one distribution for
    # every public sample (their label priors): 0.2 from each other (flat priors look alike), 0.6 from the informative
    # client of their own group (3 -> 0, 4 -> 1, 5 -> 2) and 1.2 from the other two.
    pairs = {(3, 4): 0.2, (3, 5): 0.2, (4, 5): 0.2, (0, 3): 0.6, (1, 4): 0.6, (2, 5): 0.6}
    pairs.update({(i, j): 1.2 for i in range(3) for j in range(3, 6) if j != i + 3})
    d = _matrix(6, 1.0, pairs)
    # read as ordinary clients, the three priors form the tightest cluster (a = 0.2; b = mean(0.6, 1.2, 1.2) = 1.0
    # for each: s = 0.8; formed at 0.2, joined to the rest at a mean of 1.0 or more: persistence >= 5): one teacher
    # for three groups under silhouette_floor
    assert cluster_clients("silhouette_floor", d).clusters == [[0], [1], [2], [3, 4, 5]]
    # placed last: the three informative clients are equally far apart, no cut of them has 2 <= K <= 2, so each is
    # alone; each prior joins the informative client nearest it (0.6 against 1.2)
    found = cluster_clients("auto", d, uninformative=[3, 4, 5])
    assert found.clusters == [[0, 3], [1, 4], [2, 5]]
    assert found.placed == {3: 0, 4: 1, 5: 2}
    assert "uninformative clients placed with the nearest informative one: 3 -> 0, 4 -> 1, 5 -> 2" in found.describe()
    # the run's line names clients, not rows: rows 0..5 are clients 10..15 here
    assert "13 -> 10, 14 -> 11, 15 -> 12" in found.describe(ids=list(range(10, 16)))
    # the threshold rules read the distances alone
    assert cluster_clients("strict", d, uninformative=[3, 4, 5]).clusters == cluster_clients("strict", d).clusters
    # with fewer than MIN_INFORMATIVE informative clients there is nothing to place them by: the rule reads everyone
    assert per_cluster_clustering(d, uninformative=[1, 2, 3, 4, 5]).labels.tolist() == \
        per_cluster_clustering(d).labels.tolist()
    with pytest.raises(ValueError, match=r"uninformative clients \[6\] must lie in 0..5"):
        per_cluster_clustering(d, uninformative=[6])


def test_a_documented_limit_two_groups_nearer_each_other_than_the_rest_pass_as_one():
    # groups {0,1,2}, {3,4,5}, {6,7,8}, {9,10,11}, 0.3 apart inside; the first two 0.6 from each other, every other
    # pair 1.0. The best cut joins the first two (K = 3): a = (2 * 0.3 + 3 * 0.6) / 5 = 0.48, b = 1.0 for each of
    # them, s = 0.52; 0.7 for the other six: mean (6 * 0.52 + 6 * 0.7) / 12 = 0.61, which beats chance, so auto keeps
    # the pair of groups as one cluster. silhouette_floor does too: it persists (1.0 / 0.6 = 1.67 >= PERSISTENCE)
    # and 0.52 clears the floor. The "Choosing B0" docs name this limit.
    g = np.repeat(np.arange(4), 3)
    d = np.where(g[:, None] == g[None, :], 0.3, 1.0)
    d[np.ix_(g < 2, g < 2)] = np.where(g[g < 2][:, None] == g[g < 2][None, :], 0.3, 0.6)
    np.fill_diagonal(d, 0.0)
    found = cluster_clients("auto", d)
    assert found.start_k == 3 and found.clusters == [[0, 1, 2, 3, 4, 5], [6, 7, 8], [9, 10, 11]]
    assert found.tests[0][:2] == (12, pytest.approx(0.61)) and found.tests[0][2] <= 0.05
    assert 1.0 / 0.6 >= PERSISTENCE and (1.0 - 0.48) / 1.0 >= FLOOR
    assert cluster_clients("silhouette_floor", d).clusters == [[0, 1, 2, 3, 4, 5], [6, 7, 8], [9, 10, 11]]


def test_an_uninformative_client_no_cluster_clearly_claims_keeps_a_teacher_of_its_own():
    # groups {0,1,2} and {3,4,5}, 0.3 inside and 1.0 between; client 6 uploads its prior only and is 1.8 from the first
    # group, 1.9 from the second (a group with no informative client of its own). Nearest: client 0, but
    # 1.8 / 1.9 = 0.947 > PLACEMENT_MARGIN: forcing it into {0,1,2} would mix two groups, so it stays alone.
    pairs = _groups([3, 3], 0.3)
    pairs.update({(i, 6): 1.8 for i in range(3)})
    pairs.update({(i, 6): 1.9 for i in range(3, 6)})
    d = _matrix(7, 1.0, pairs)
    assert 1.8 / 1.9 > PLACEMENT_MARGIN
    found = cluster_clients("auto", d, uninformative=[6])
    assert found.clusters == [[0, 1, 2], [3, 4, 5], [6]] and found.placed == {} and found.unplaced == [6]
    assert "uninformative clients alone (no informative cluster clearly nearest): [6]" in found.describe()
    # at 0.7 from the first group (0.7 / 1.9 = 0.37) it is placed there
    d[6, :3] = d[:3, 6] = 0.7
    assert cluster_clients("auto", d, uninformative=[6]).clusters == [[0, 1, 2, 6], [3, 4, 5]]


def test_too_few_informative_clients_read_every_client_and_say_so():
    # clients 0 and 1 informative, 2-4 upload their priors: nothing to place them by
    pairs = {(2, 3): 0.1, (2, 4): 0.1, (3, 4): 0.1}
    d = _matrix(5, 1.0, pairs)
    found = cluster_clients("auto", d, uninformative=[2, 3, 4])
    assert found.read_all and found.placed == {}
    assert found.clusters == cluster_clients("auto", d).clusters
    assert "too few informative clients to place the uninformative ones by" in found.describe()

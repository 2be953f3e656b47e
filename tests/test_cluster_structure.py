"""The default B0 rule (``auto``: the best silhouette among separated clusterings) and the structure a run reports
(issue 26), on hand-made distance matrices: clear groups, weak structure, one group."""

import math

import numpy as np
import pytest

from cosmos_pl.clustering import (greedy_clustering, greedy_labels, resolve_b0, separated_threshold,
                                  silhouette_threshold, structure)


def _matrix(n: int, pairs: dict[tuple[int, int], float], rest: float) -> np.ndarray:
    d = np.full((n, n), rest)
    np.fill_diagonal(d, 0.0)
    for (i, j), v in pairs.items():
        d[i, j] = d[j, i] = v
    return d


def test_clear_groups_are_found_and_reported_by_hand():
    # 3 groups of 2 (within 0.2), every other pair 1.0 apart
    d = _matrix(6, {(0, 1): 0.2, (2, 3): 0.2, (4, 5): 0.2}, 1.0)
    b0 = separated_threshold(d)
    assert b0 == pytest.approx(0.2)
    assert greedy_clustering(d, b0) == [[0, 1], [2, 3], [4, 5]]
    st = structure(d, greedy_labels(d, b0))
    # each client: a = 0.2 (its one partner), b = 1.0 (every other cluster): s = (1.0 - 0.2) / 1.0 = 0.8
    assert st.silhouette == pytest.approx(0.8)
    assert (st.K, st.within_max, st.between_min) == (3, pytest.approx(0.2), pytest.approx(1.0))
    assert st.separation == pytest.approx(5.0)
    assert st.separated and not st.weak and st.reasons() == []
    record = st.as_dict()
    assert record == {"silhouette": 0.8, "within_max": 0.2, "between_min": 1.0, "separation": 5.0,
                      "separated": True, "weak": False}


# Five clients: 0 and 1 are 0.3 apart, 0 and 2 0.5, 2, 3 and 4 0.9 from each other, every other pair 1.0.
WEAK = _matrix(5, {(0, 1): 0.3, (0, 2): 0.5, (2, 3): 0.9, (2, 4): 0.9, (3, 4): 0.9}, 1.0)


def test_the_silhouette_rule_merges_what_is_not_separated_and_auto_does_not():
    # candidates: B0 0.3 -> {0,1},{2},{3},{4}; 0.5 -> {0,1,2},{3},{4}; 0.9 -> {0,2,3,4},{1}; 1.0 -> one cluster
    b0 = silhouette_threshold(WEAK)
    assert b0 == pytest.approx(0.5)
    assert greedy_clustering(WEAK, b0) == [[0, 1, 2], [3], [4]]
    st = structure(WEAK, greedy_labels(WEAK, b0))
    # silhouettes by hand: client 0: a = mean(0.3, 0.5) = 0.4, b = 1 -> 0.6; client 1: a = mean(0.3, 1) = 0.65,
    # b = 1 -> 0.35; client 2: a = mean(0.5, 1) = 0.75, b = 0.9 -> 1/6; clients 3 and 4 alone: 0
    assert st.silhouette == pytest.approx((0.6 + 0.35 + 1 / 6) / 5)
    # 1 and 2 share a cluster 1.0 apart while 2 is 0.9 from 3 in another: not separated
    assert (st.within_max, st.between_min) == (pytest.approx(1.0), pytest.approx(0.9))
    assert not st.separated and st.weak
    assert "a cluster holds clients 1.000 apart while clients of different clusters are 0.900 apart" in st.reasons()

    # the only separated clustering with 2 <= K <= N - 1 is B0 = 0.3: {0, 1} and three alone. Client 0: a = 0.3,
    # b = min(0.5, 1, 1) = 0.5 -> 0.4; client 1: a = 0.3, b = 1 -> 0.7; singletons 0: silhouette 0.22 < 0.25
    st = structure(WEAK, greedy_labels(WEAK, 0.3))
    assert st.separated and (st.within_max, st.between_min) == (pytest.approx(0.3), pytest.approx(0.5))
    assert st.silhouette == pytest.approx((0.4 + 0.7) / 5)
    assert st.weak and st.reasons() == [f"silhouette {st.silhouette:.3f} < 0.25"]
    # so auto leaves every client alone (B0 = 0), and says so
    assert resolve_b0("auto", WEAK) == 0.0
    alone = structure(WEAK, greedy_labels(WEAK, 0.0))
    assert alone.K == 5 and alone.weak
    assert alone.reasons() == ["no two clients share a cluster (K = N)"]


def test_auto_finds_clear_groups_among_100_clients_exactly():
    # 20 groups of 5: within 0.1-0.3, between 0.8-1.2. The separated clusterings lie in two narrow bands of the
    # sorted distances; auto enumerates them exactly (no grid) and finds the 20 groups.
    rng = np.random.default_rng(3)
    groups = np.repeat(np.arange(20), 5)
    d = np.where(groups[:, None] == groups[None, :], rng.uniform(0.1, 0.3, (100, 100)),
                 rng.uniform(0.8, 1.2, (100, 100)))
    d = np.triu(d, 1)
    d = d + d.T
    b0 = resolve_b0("auto", d)
    labels = greedy_labels(d, b0)
    assert sorted(map(sorted, greedy_clustering(d, b0))) == [list(range(5 * g, 5 * g + 5)) for g in range(20)]
    st = structure(d, labels)
    assert st.separated and not st.weak and st.within_max <= 0.3 < 0.8 <= st.between_min
    assert b0 == pytest.approx(st.within_max)  # the farthest within-cluster distance: where the groups are cliques


def test_a_clear_pair_among_loners_is_kept():
    # {0, 1} 0.1 apart, every other pair 1.0: client 0 and 1: a = 0.1, b = 1 -> 0.9; three alone: silhouette 0.36
    d = _matrix(5, {(0, 1): 0.1}, 1.0)
    assert resolve_b0("auto", d) == pytest.approx(0.1)
    st = structure(d, greedy_labels(d, 0.1))
    assert st.silhouette == pytest.approx(1.8 / 5) and not st.weak


def test_one_group_is_never_merged_silently():
    # 6 clients of one distribution: every pair about 0.30 apart. auto finds no clear groups: the closest pair
    # alone is separated (0.300 < 0.301) but its silhouette is near 0, so every client stays alone, the structure
    # is weak and the warning names b0 'inf' (one cluster), which gives K = 1.
    rng = np.random.default_rng(0)
    d = np.zeros((6, 6))
    iu = np.triu_indices(6, 1)
    d[iu] = 0.30 + rng.permutation(15) * 0.001
    d = d + d.T
    pair = structure(d, greedy_labels(d, 0.30))
    assert pair.separated and pair.silhouette < 0.25
    assert resolve_b0("auto", d) == 0.0
    assert structure(d, greedy_labels(d, 0.0)).weak
    ones = greedy_clustering(d, resolve_b0("inf", d))
    assert ones == [list(range(6))]
    one = structure(d, greedy_labels(d, math.inf))
    assert (one.K, one.silhouette, one.between_min) == (1, None, math.inf)
    assert one.weak and one.reasons() == ["one cluster: nothing to compare its clients' distances with"]


def test_no_separated_clustering_leaves_every_client_alone():
    # four clients, every pair exactly 0.5 apart: no clustering with 2 <= K <= 3 separates; B0 = 0, K = N (weak)
    d = _matrix(4, {}, 0.5)
    assert separated_threshold(d) == 0.0
    st = structure(d, greedy_labels(d, 0.0))
    assert st.K == 4 and st.weak
    assert st.reasons()[0] == "no two clients share a cluster (K = N)"
    assert separated_threshold(np.array([[0.0, 1.0], [1.0, 0.0]])) == math.inf  # N = 2: one cluster, as before


def test_cosmos_logs_the_structure_and_one_warning_line_when_weak(monkeypatch):
    import torch

    import cosmos_pl.algorithms.cosmos as module
    from cosmos_pl.algorithms import COSMOS

    lines: list[str] = []

    class Ctx:  # what COSMOS's clustering reads of the federation context
        num_clients, num_classes = 5, 2
        log = staticmethod(lines.append)

        @staticmethod
        def make_backbone(name, seed):
            return torch.nn.Linear(1, 1)

        @staticmethod
        def stage_seed(*args):
            return 0

    algo = COSMOS(teacher_backbone="test_efficientnet", b0="silhouette")
    algo.setup(Ctx())
    monkeypatch.setattr(module, "pairwise_distances", lambda uploads, metric: WEAK)  # uploads with WEAK's distances
    algo._cluster(list(range(5)), torch.zeros(5, 1, 2))
    assert algo.clusters == [[0, 1, 2], [3], [4]]
    assert lines[0].startswith("clustering: B0=0.5000 (silhouette) -> K=3")
    assert "silhouette 0.223, farthest within a cluster 1.000, nearest between clusters 0.900" in lines[0]
    warnings = [line for line in lines if line.startswith("warning:")]
    assert len(warnings) == 1 and "algorithm.init_args.b0" in warnings[0] and "pretrain_epochs" in warnings[0]
    info = algo.clustering_info()
    assert info["structure"]["weak"] is True and info["structure"]["between_min"] == 0.9

    lines.clear()
    algo = COSMOS(teacher_backbone="test_efficientnet")  # the default, auto: every client alone
    algo.setup(Ctx())
    algo._cluster(list(range(5)), torch.zeros(5, 1, 2))
    assert algo.clusters == [[0], [1], [2], [3], [4]]
    warnings = [line for line in lines if line.startswith("warning:")]
    assert len(warnings) == 1 and "each client has its own teacher" in warnings[0]

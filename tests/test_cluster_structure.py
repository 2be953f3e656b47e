"""The threshold rule ``strict`` (the best silhouette among separated clusterings; the default before ``auto``) and
the structure a run reports, on hand-made distance matrices: clear groups, weak structure, one group."""

import math

import numpy as np
import pytest

from cosmos_pl.clustering import (cluster_clients, greedy_clustering, greedy_labels, resolve_b0, separated_threshold,
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
                      "separated": True, "alone": 0, "clustered_silhouette": 0.8, "weakest_cluster_silhouette": 0.8,
                      "weak": False}
    assert cluster_clients("auto", d).clusters == [[0, 1], [2, 3], [4, 5]]


# Five clients: 0 and 1 are 0.3 apart, 0 and 2 0.5, 2, 3 and 4 0.9 from each other, every other pair 1.0.
WEAK = _matrix(5, {(0, 1): 0.3, (0, 2): 0.5, (2, 3): 0.9, (2, 4): 0.9, (3, 4): 0.9}, 1.0)


def test_the_silhouette_rule_merges_what_is_not_separated_and_strict_does_not():
    # candidates: B0 0.3 -> {0,1},{2},{3},{4}; 0.5 -> {0,1,2},{3},{4}; 0.9 -> {0,2,3,4},{1}; 1.0 -> one cluster
    b0 = silhouette_threshold(WEAK)
    assert b0 == pytest.approx(0.5)
    assert greedy_clustering(WEAK, b0) == [[0, 1, 2], [3], [4]]
    st = structure(WEAK, greedy_labels(WEAK, b0))
    # silhouettes by hand: client 0: a = mean(0.3, 0.5) = 0.4, b = 1 -> 0.6; client 1: a = mean(0.3, 1) = 0.65,
    # b = 1 -> 0.35; client 2: a = mean(0.5, 1) = 0.75, b = 0.9 -> 1/6; clients 3 and 4 alone: 0
    assert st.silhouette == pytest.approx((0.6 + 0.35 + 1 / 6) / 5)
    # 1 and 2 share a cluster 1.0 apart while 2 is 0.9 from 3 in another: not separated, but the three clustered
    # clients show structure (their mean silhouette (0.6 + 0.35 + 1/6) / 3 = 0.372), so it is not weak
    assert (st.within_max, st.between_min, st.alone) == (pytest.approx(1.0), pytest.approx(0.9), 2)
    assert not st.separated and not st.weak and st.clustered_silhouette == pytest.approx((0.6 + 0.35 + 1 / 6) / 3)

    # the only separated clustering with 2 <= K <= N - 1 is B0 = 0.3: {0, 1} and three alone. Client 0: a = 0.3,
    # b = min(0.5, 1, 1) = 0.5 -> 0.4; client 1: a = 0.3, b = 1 -> 0.7; singletons 0: silhouette 0.22 < 0.25
    st = structure(WEAK, greedy_labels(WEAK, 0.3))
    assert st.separated and (st.within_max, st.between_min) == (pytest.approx(0.3), pytest.approx(0.5))
    assert st.silhouette == pytest.approx((0.4 + 0.7) / 5)
    assert not st.weak and st.clustered_silhouette == pytest.approx(0.55)  # loners do not make structure weak
    # strict's own floor is over every client, loners included: 0.22 < 0.25, so it leaves every client alone
    assert resolve_b0("strict", WEAK) == 0.0
    alone = structure(WEAK, greedy_labels(WEAK, 0.0))
    assert alone.K == 5 and alone.weak
    assert alone.reasons() == ["no two clients share a cluster (K = N)"]


def test_strict_and_auto_find_clear_groups_among_100_clients_exactly():
    # 20 groups of 5: within 0.1-0.3, between 0.8-1.2. The separated clusterings lie in two narrow bands of the
    # sorted distances; strict enumerates them exactly (no grid) and finds the 20 groups, as auto does.
    rng = np.random.default_rng(3)
    groups = np.repeat(np.arange(20), 5)
    d = np.where(groups[:, None] == groups[None, :], rng.uniform(0.1, 0.3, (100, 100)),
                 rng.uniform(0.8, 1.2, (100, 100)))
    d = np.triu(d, 1)
    d = d + d.T
    b0 = resolve_b0("strict", d)
    labels = greedy_labels(d, b0)
    assert sorted(map(sorted, greedy_clustering(d, b0))) == [list(range(5 * g, 5 * g + 5)) for g in range(20)]
    st = structure(d, labels)
    assert st.separated and not st.weak and st.within_max <= 0.3 < 0.8 <= st.between_min
    assert b0 == pytest.approx(st.within_max)  # the farthest within-cluster distance: where the groups are cliques
    assert sorted(cluster_clients("auto", d).clusters) == [list(range(5 * g, 5 * g + 5)) for g in range(20)]


def test_a_clear_pair_among_loners_is_kept():
    # {0, 1} 0.1 apart, every other pair 1.0: client 0 and 1: a = 0.1, b = 1 -> 0.9; three alone: silhouette 0.36
    d = _matrix(5, {(0, 1): 0.1}, 1.0)
    assert resolve_b0("strict", d) == pytest.approx(0.1)
    assert cluster_clients("auto", d).clusters == [[0, 1], [2], [3], [4]]
    st = structure(d, greedy_labels(d, 0.1))
    assert st.silhouette == pytest.approx(1.8 / 5) and not st.weak


def test_one_group_is_never_merged_silently():
    # 6 clients of one distribution: every pair about 0.30 apart. strict finds no clear groups: the closest pair
    # alone is separated (0.300 < 0.301) but its silhouette is near 0, so every client stays alone, the structure
    # is weak and the warning names b0 'inf' (one cluster), which gives K = 1. auto keeps no cluster either (the
    # best cut's silhouettes are 0.008-0.02, below the floor).
    rng = np.random.default_rng(0)
    d = np.zeros((6, 6))
    iu = np.triu_indices(6, 1)
    d[iu] = 0.30 + rng.permutation(15) * 0.001
    d = d + d.T
    pair = structure(d, greedy_labels(d, 0.30))
    assert pair.separated and pair.silhouette < 0.25
    assert resolve_b0("strict", d) == 0.0
    assert structure(d, greedy_labels(d, 0.0)).weak
    assert cluster_clients("auto", d).clusters == [[i] for i in range(6)]
    ones = greedy_clustering(d, resolve_b0("inf", d))
    assert ones == [list(range(6))]
    one = structure(d, greedy_labels(d, math.inf))
    assert (one.K, one.silhouette, one.between_min) == (1, None, math.inf)
    assert one.weak and one.reasons() == ["one cluster: nothing to compare its clients' distances with"]


def test_a_cluster_below_the_floor_is_weak_by_hand():
    # Algorithm 1 at B0 = 0.9 on WEAK: {0, 2, 3, 4} and {1}. Client 0: a = mean(0.5, 1, 1) = 0.8333, b = 0.3 (client
    # 1) -> -0.64; 2: a = mean(0.5, 0.9, 0.9) = 0.7667, b = 1 -> 0.2333; 3, 4: a = mean(1, 0.9, 0.9) = 0.9333,
    # b = 1 -> 0.0667. The cluster's mean -0.0683 is below the floor 0.2 and 0.25: weak, for both reasons.
    st = structure(WEAK, greedy_labels(WEAK, 0.9))
    assert st.weakest == pytest.approx((-0.64 + 0.7 / 3 + 2 * 0.2 / 3) / 4)
    assert st.reasons() == ["silhouette of the clustered clients -0.068 < 0.25", "a cluster's mean silhouette is "
                            "-0.068 < 0.2"]


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

    import cosmos_pl.clustering.inputs as module  # where COSMOS's clustering step computes its distances
    from cosmos_pl.algorithms import COSMOS

    lines: list[str] = []

    class Ctx:  # what COSMOS's clustering reads of the federation context
        num_clients, num_classes = 5, 2
        backbones = ["a", "b", "a", "b", "a", "b"]
        log = staticmethod(lines.append)

        @staticmethod
        def make_backbone(name, seed):
            return torch.nn.Linear(1, 1)

        @staticmethod
        def stage_seed(*args):
            return 0

    algo = COSMOS(teacher_backbone="test_efficientnet", b0=0.9)
    algo.setup(Ctx())
    monkeypatch.setattr(module, "pairwise_distances", lambda uploads, metric, budget: WEAK)  # WEAK's distances
    varied = torch.tensor([[0.9, 0.1], [0.1, 0.9], [0.9, 0.1]])  # differs between samples: spread 0.711
    algo._cluster(list(range(5)), varied.expand(5, 3, 2))
    assert algo.clusters == [[0, 2, 3, 4], [1]]
    assert lines[0].startswith("clustering: B0=0.9000 (number) -> K=2")
    assert "1 client(s) alone; silhouette -0.055, farthest within a cluster 1.000, nearest between clusters 0.300" \
        in lines[0]
    warnings = [line for line in lines if line.startswith("warning:")]
    assert len(warnings) == 1 and "algorithm.init_args.b0" in warnings[0] and "pretrain_epochs" in warnings[0]
    assert "a teacher may mix clients of different distributions" in warnings[0]
    info = algo.clustering_info()
    assert info["structure"]["weak"] is True and info["structure"]["between_min"] == 0.3

    lines.clear()
    one = np.zeros((6, 6))
    one[np.triu_indices(6, 1)] = 0.30 + np.random.default_rng(0).permutation(15) * 0.001
    monkeypatch.setattr(module, "pairwise_distances", lambda uploads, metric, budget: one + one.T)
    Ctx.num_clients = 6
    algo = COSMOS(teacher_backbone="test_efficientnet")  # the default, auto: no cluster the distances support
    algo.setup(Ctx())
    algo._cluster(list(range(6)), varied.expand(6, 3, 2))
    assert algo.clusters == [[i] for i in range(6)]
    warnings = [line for line in lines if line.startswith("warning:")]
    assert len(warnings) == 1 and "each client has its own teacher" in warnings[0]

    lines.clear()  # clients that output one distribution for every public sample are named
    algo = COSMOS(teacher_backbone="test_efficientnet")
    algo.setup(Ctx())
    constant = varied.expand(6, 3, 2).clone()
    constant[4] = torch.tensor([0.7, 0.3])  # the same pseudo-label for every public sample: spread 0
    algo._cluster(list(range(6)), constant)
    assert any(line.startswith("warning: client(s) [4] uploaded nearly the same pseudo-label") for line in lines)
    assert algo.clustering_info()["constant_clients"] == [4]

    lines.clear()  # {0, 2, 4} and {1, 3, 5}: clear groups, each of one architecture of the two: both named
    monkeypatch.setattr(module, "pairwise_distances",
                        lambda uploads, metric, budget: _matrix(6, {(0, 2): .2, (0, 4): .2, (2, 4): .2, (1, 3): .2,
                                                                    (1, 5): .2, (3, 5): .2}, 1.0))
    algo = COSMOS(teacher_backbone="test_efficientnet")
    algo.setup(Ctx())
    algo._cluster(list(range(6)), varied.expand(6, 3, 2))
    assert algo.clusters == [[0, 2, 4], [1, 3, 5]]
    named = [line for line in lines if "holds only" in line]
    assert [line.split(" holds only ")[1].split(" clients")[0] for line in named] == ["a", "b"]
    assert named[0].startswith("warning: cluster [0, 2, 4] holds only a clients, of the 2 architectures")

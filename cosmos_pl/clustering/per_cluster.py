"""The default clustering rule, ``b0: auto``: average-linkage clusters, kept where the cut beats chance.

Algorithm 1 with one threshold B0 treats every cluster alike, and a rule that judges the whole clustering by its
overlap (``strict``) gives up on every cluster when one pair of clients overlaps. This rule reads the client
distances alone (never group ids):

1. **A hierarchy.** Average linkage (UPGMA; Sokal and Michener, 1958) over the ``[N, N]`` distances: clusters are
   merged in order of their mean pairwise distance, so a client that lies between groups does not chain them (as
   single linkage does) and no cluster is formed around a client that is close to everyone (as Algorithm 1's
   greedy centre can be).
2. **A start.** The flat cut of that hierarchy with the best mean silhouette (Rousseeuw, 1987), over
   ``2 <= K <= N - 1`` (every cut while there are at most :data:`EXHAUSTIVE_CUTS` of them; above, every K up to 48,
   a geometric grid beyond, and every K around the grid's best).
3. **The cut against chance** (``keep="chance"``, ``b0: auto``; :mod:`~cosmos_pl.clustering.chance`): the start
   cut is kept only where its mean silhouette beats what steps 1-2 find in shuffles of the same distances (a
   permutation test). Where it is kept, a client whose silhouette is negative (on average nearer the clients of
   another cluster than those of its own; judged against the start's other clusters, fixed, so one cluster's
   verdict does not shift another's) leaves its cluster and keeps a teacher of its own.

   Where it is not kept, every client keeps a teacher of its own. ``keep="floor"`` (``b0: silhouette_floor``, a
   fixed rule without the permutation test) keeps each cluster instead on its own silhouette: after the clients
   that left, at a mean silhouette of :data:`FLOOR` and a persistence of :data:`PERSISTENCE` (the hierarchy joins it
   to the rest at a mean distance at least that many times the one at which its own clients were joined; Fred and
   Jain's lifetime, 2005).

4. **Uninformative clients placed last.** A client whose upload is (nearly) the same distribution for every public
   sample (its spread under :data:`~cosmos_pl.clustering.distances.CONSTANT_SPREAD`: typically a model that learnt
   its label prior and nothing else) says nothing about U; its distances compare priors and confidence. Left in
   steps 1-3 such clients bend the hierarchy (on ``digits_smoke`` the best cut split them from the rest, and every
   cluster was then dissolved). So steps 1-3 run on the other clients, and each uninformative client joins the
   cluster of the informative client nearest it, a nearest-neighbour placement as for a client that missed the
   clustering round: its prior is nearest the outputs of clients that learnt the same classes (measured on the
   configs' PTC uploads, ``digits_smoke`` seeds 0-9 and Fashion-MNIST at 10, 20 and 40 clients, seeds 0-4: the nearest
   informative client was one of its own group for all 128 uninformative clients). It is placed only where that cluster is
   clearly the nearest (:data:`PLACEMENT_MARGIN`), else it keeps a teacher of its own; with fewer than
   :data:`MIN_INFORMATIVE` informative clients nothing is placed and steps 1-3 read every client.

So an overlapping pair costs at most the clients involved; a client that fits no cluster stays alone without
sending the others to their own teachers; a cut no better than the same distances shuffled (a cluster of every
client but one, when no group stands out) is not trained as one teacher. Cost: the linkage O(N^2) time
(nearest-neighbour chain) and memory, each silhouette O(N^2), at most about 2 * :data:`EXHAUSTIVE_CUTS` of them;
the chance test repeats steps 1-2 on 19 shuffles of at most :data:`~cosmos_pl.clustering.chance.NULL_CLIENTS`
clients (``benchmarks/server_scale.py`` times N = 2,000 and 10,000).

Limits: shuffles keep the distances' values and move them, so the test reads how the small distances are
arranged (into groups whose clients are all close to each other), not how small they are: a pair of close clients
among unrelated ones is no evidence (some pair is always closest), so a cut of a few pairs and many clients alone
is kept only where the rest of it beats chance; below :data:`CHANCE_MIN_CLIENTS` clients there is no test and
clusters are kept as ``silhouette_floor`` keeps them. Groups whose uploads are much closer to each other than to
the rest (two groups 0.6 from each other and 1.0 from all others, 0.3 within) pass as one cluster, as the best cut
joins them (``tests/test_per_cluster.py``; testing each kept cluster again inside split them, but split true groups
of 50 and 100 planted clients too, so it was left out). The test keeps a structureless cut more often than one
time in twenty (4 of 20 shuffled matrices of 20 clients; ``tests/test_chance.py``), and its clients, whose uploads
disagree, then share teachers. A weak client whose uploads sit between two groups can join the wrong one
(``benchmarks/cluster_recovery.py`` gives the figures). Clients whose uploads are flat but not constant are
compared after the confidence floor (:mod:`~cosmos_pl.clustering.confidence`), not here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional, Sequence

import numpy as np

from cosmos_pl.clustering import chance
from cosmos_pl.clustering.threshold import FLOOR, silhouettes  # FLOOR lives there: the structure report reads it

__all__ = ["FLOOR", "PERSISTENCE", "EXHAUSTIVE_CUTS", "MIN_INFORMATIVE", "PLACEMENT_MARGIN", "PerCluster",
           "per_cluster_clustering"]

#: A cluster is kept only when the hierarchy joins it to the rest at a mean distance at least this many times the
#: mean distance at which its own clients were joined (its persistence; the lifetime of Fred and Jain, 2005). On
#: the configs' uploads a cluster of every client but one, formed from disagreeing clients, persisted 1.05-1.14;
#: true groups 1.35-2.4, and 1.19 and more on the planted federations with overlapping groups.
PERSISTENCE = 1.2

#: Every cut of the hierarchy is scored while N - 2 <= this; above, a coarse grid of K refined around its best.
EXHAUSTIVE_CUTS = 128

#: Uninformative clients are placed by step 4 only while at least this many informative clients remain to cluster
#: (below it, the rule runs on every client: with one or two informative clients there is no structure to read).
MIN_INFORMATIVE = 3

#: Step 4 places an uninformative client only where its nearest informative client is at most this many times as
#: far as the nearest client of any other cluster; otherwise it keeps a teacher of its own (a client of a group that
#: has no informative client is then not forced into another group). On the configs' uploads the 128 placements
#: (all of a client's own group) had ratios 0.40 (median) to 0.74.
PLACEMENT_MARGIN = 0.8

#: ``auto`` tests the cut against chance from this many (informative) clients; with fewer it keeps clusters as
#: ``silhouette_floor`` does. Shuffles of at most 10 distances reproduce any cut too often for a test at 0.05: two
#: pairs among 4 clients come back in 1 shuffle of 5, a triangle among 5 clients in 1 of 12.
CHANCE_MIN_CLIENTS = 6



@dataclass
class PerCluster:
    """The outcome of :func:`per_cluster_clustering`.

    Attributes:
        labels: each client's cluster ``[N]`` (0..K-1, in order of each cluster's lowest client).
        start: the start cut's labels ``[N]`` (the best-silhouette cut of the hierarchy).
        left: the clients that left their cluster for a teacher of their own (negative silhouette).
        dissolved: how many clusters of the start were dissolved (mean silhouette below the floor, or not
            persistent): their clients keep teachers of their own.
        alone_dissolved: the clients of those clusters.
        placed: each uninformative client placed by step 4, with the informative client whose cluster it joined.
        unplaced: uninformative clients step 4 left alone (no informative cluster clearly nearest).
        read_all: True where uninformative clients were named but too few informative ones remained
            (:data:`MIN_INFORMATIVE`), so steps 1-3 read every client and nothing was placed.
        tests: (``keep="chance"``) the chance test of the start cut, ``[(clients, mean silhouette, p-value)]``
            (:mod:`~cosmos_pl.clustering.chance`); empty where there was no cut to test.
    """

    labels: np.ndarray
    start: np.ndarray
    left: list[int] = field(default_factory=list)
    dissolved: int = 0
    alone_dissolved: list[int] = field(default_factory=list)
    placed: dict[int, int] = field(default_factory=dict)
    unplaced: list[int] = field(default_factory=list)
    read_all: bool = False
    tests: list[tuple[int, float, float]] = field(default_factory=list)


def _linkage(d: np.ndarray) -> np.ndarray:
    from scipy.cluster.hierarchy import linkage
    from scipy.spatial.distance import squareform

    return linkage(squareform(d, checks=False), method="average")


def _cut_labels(tree: np.ndarray, k: int) -> np.ndarray:
    from scipy.cluster.hierarchy import fcluster

    return fcluster(tree, k, criterion="maxclust") - 1


def _start_cut(d: np.ndarray, tree: np.ndarray, most: Optional[int] = None) -> np.ndarray:
    """The cut with the best mean silhouette over 2 <= K <= N - 1, or K <= ``most`` (ties: the smaller K).

    Every cut's clusters are contiguous in the hierarchy's leaf order, so the distances are put in that order once
    and each cut's silhouette sums whole column ranges (no copy of the ``[N, N]`` matrix per cut)."""
    from scipy.cluster.hierarchy import leaves_list

    n = d.shape[0]
    order = leaves_list(tree)
    ordered = d[np.ix_(order, order)]
    scores: dict[int, float] = {}

    def score(k: int) -> float:
        if k not in scores:
            labels = _cut_labels(tree, k)[order]
            run = np.cumsum(np.diff(labels, prepend=-1) != 0) - 1  # each cluster is one run of the leaf order
            # equal merge heights can give fewer clusters than asked
            scores[k] = float(silhouettes(ordered, run).mean()) if 2 <= run[-1] + 1 <= n - 1 else -np.inf
        return scores[k]

    top = n - 1 if most is None else min(most, n - 1)
    if top < 2:
        return np.arange(n)
    if top - 1 <= EXHAUSTIVE_CUTS:
        candidates = list(range(2, top + 1))
    else:  # every small K (few groups is the common case), a geometric grid above, then all K around the best
        grid = np.unique(np.geomspace(2, top, EXHAUSTIVE_CUTS // 2).astype(int))
        candidates = sorted(set(range(2, min(top, 48) + 1)) | set(grid.tolist()))
        best = max(candidates, key=lambda k: (score(k), -k))
        pos = candidates.index(best)
        lo, hi = candidates[max(pos - 1, 0)], candidates[min(pos + 1, len(candidates) - 1)]
        candidates += list(range(lo, hi + 1))
    best = max(sorted(set(candidates)), key=lambda k: (score(k), -k))
    if score(best) == -np.inf:  # every merge at one height: no cut has 2 <= K <= N - 1, no cluster to start from
        return np.arange(n)
    return _cut_labels(tree, best)


def _means_to_clusters(d: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """``[N, K]``: each client's mean distance to the clients of each cluster of ``labels`` (0..K-1). O(N^2)."""
    counts = np.bincount(labels)
    order = np.argsort(labels, kind="stable")
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    return np.add.reduceat(d[:, order], starts, axis=1) / counts


def _silhouettes(d: np.ndarray, members: np.ndarray, outside: np.ndarray) -> np.ndarray:
    """Silhouettes of ``members``: a = mean distance to the other members, b = ``outside`` ``[len(members)]``, the
    smallest mean distance to another cluster; 0 for a cluster of one."""
    if len(members) < 2:
        return np.zeros(len(members))
    a = d[np.ix_(members, members)].sum(axis=1) / (len(members) - 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.nan_to_num((outside - a) / np.maximum(a, outside))


def per_cluster_clustering(distances: np.ndarray, floor: float = FLOOR, persistence: float = PERSISTENCE,
                           uninformative: Sequence[int] = (), keep: str = "chance") -> PerCluster:
    """The ``auto`` rule: average-linkage clusters, each kept, trimmed or dissolved on its own evidence (see the
    module docstring for the steps and their sources).

    Args:
        distances: ``[N, N]`` symmetric client distances (pseudo-label L1 per public sample, Section 4.1).
        floor: (``keep="floor"``) the smallest mean silhouette a cluster of two or more clients keeps.
        persistence: (``keep="floor"``) the smallest persistence a kept cluster has.
        keep: how step 3 keeps a cluster: ``"chance"`` (``b0: auto``) where it is tighter than chance
            (:mod:`~cosmos_pl.clustering.chance`), ``"floor"`` (``b0: silhouette_floor``, the rule ``auto`` was
            before) at a mean silhouette of ``floor`` and a persistence of ``persistence``.
        uninformative: clients whose upload is (nearly) one distribution for every public sample (their spread is
            under :data:`cosmos_pl.clustering.distances.CONSTANT_SPREAD`). While at least
            :data:`MIN_INFORMATIVE` other clients remain, the rule runs on those, and each uninformative client then
            joins the cluster of the informative client nearest it where that cluster is clearly the nearest (see
            the module docstring, step 4).

    Returns:
        :class:`PerCluster`; N <= 2 gives one cluster (nothing to compare the distance with).

    Raises:
        ValueError: a non-square matrix, an ``uninformative`` index outside 0..N-1, or another ``keep``.
    """
    if keep not in ("chance", "floor"):
        raise ValueError(f"keep={keep!r}: give 'chance' or 'floor'")
    d = np.asarray(distances, dtype=float)
    if d.ndim != 2 or d.shape[0] != d.shape[1]:
        raise ValueError(f"distances must be a square [N, N] matrix, got shape {d.shape}")
    n = d.shape[0]
    flat = np.unique(np.asarray(list(uninformative), dtype=np.int64))
    if flat.size and (flat.min() < 0 or flat.max() >= n):
        raise ValueError(f"uninformative clients {flat.tolist()} must lie in 0..{n - 1} (rows of the distances)")
    informative = np.setdiff1d(np.arange(n), flat)
    if flat.size == 0:
        return _clustering(d, floor, persistence, keep)
    if len(informative) < MIN_INFORMATIVE:
        out = _clustering(d, floor, persistence, keep)
        out.read_all = True
        return out
    inner = _clustering(d[np.ix_(informative, informative)], floor, persistence, keep)
    labels, start = np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64)
    labels[informative], start[informative] = inner.labels, inner.start
    placed, unplaced = {}, []
    fresh = int(labels[informative].max()) + 1
    for c in flat.tolist():
        j = int(informative[np.argmin(d[c, informative])])  # ties: the lowest client
        if _clearly_nearest(d, c, j, informative, labels):
            labels[c], start[c], placed[c] = labels[j], start[j], j
        else:  # no informative cluster stands out as its own: a teacher of its own
            labels[c] = start[c] = fresh
            fresh += 1
            unplaced.append(c)
    return PerCluster(_in_order(labels), _in_order(start), informative[inner.left].tolist(), inner.dissolved,
                      informative[inner.alone_dissolved].tolist(), placed, unplaced, tests=inner.tests)


def _clearly_nearest(d: np.ndarray, c: int, j: int, informative: np.ndarray, labels: np.ndarray) -> bool:
    """Whether uninformative client ``c`` is clearly nearest informative client ``j``'s cluster: at most
    :data:`PLACEMENT_MARGIN` times as far from ``j`` as from the nearest client of any other cluster, or, where
    ``j``'s cluster holds every informative client, no farther from ``j`` than that cluster's widest pair."""
    mine = informative[labels[informative] == labels[j]]
    others = informative[labels[informative] != labels[j]]
    if others.size:
        return bool(d[c, j] <= PLACEMENT_MARGIN * d[c, others].min())
    return bool(mine.size > 1 and d[c, j] <= d[np.ix_(mine, mine)].max())


def _in_order(labels: np.ndarray) -> np.ndarray:
    """``labels`` renumbered 0..K-1 in order of each cluster's lowest client."""
    _, first, inverse = np.unique(labels, return_index=True, return_inverse=True)
    rank = np.empty(len(first), dtype=np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(len(first))
    return rank[inverse]


def _clustering(d: np.ndarray, floor: float, persistence: float, keep: str) -> PerCluster:
    """Steps 1-3 of the module docstring on every client of ``d`` ``[N, N]``."""
    n = d.shape[0]
    if n <= 2:
        one = np.zeros(n, dtype=np.int64)
        return PerCluster(one, one.copy())
    tree = _linkage(d)
    start = _start_cut(d, tree)
    out = PerCluster(np.empty(n, dtype=np.int64), start)
    if start.max() == n - 1:  # no cut of 2 <= K <= N - 1: nothing to keep
        kept: list[np.ndarray] = []
    elif keep == "chance" and n >= CHANCE_MIN_CLIENTS:
        kept = _kept_by_chance(d, start, out)
    else:
        kept = _kept_by_floor(d, tree, start, floor, persistence, out)
    alone = np.setdiff1d(np.arange(n), np.concatenate(kept) if kept else np.array([], dtype=np.int64))
    kept += _identical(d, alone)
    kept.sort(key=lambda m: int(m.min()))
    for k, members in enumerate(kept):
        out.labels[members] = k
    out.left.sort()
    return out


def _trimmed(d: np.ndarray, start: np.ndarray) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Per cluster of ``start``: ``(members, silhouettes, b)``, each silhouette against the start's other clusters
    (fixed, so that one cluster's verdict does not shift another's; b: each member's smallest mean distance to
    one of them)."""
    means = _means_to_clusters(d, start)
    out = []
    for k in range(means.shape[1]):
        members = np.flatnonzero(start == k)
        outside = np.delete(means[members], k, axis=1).min(axis=1)
        out.append((members, _silhouettes(d, members, outside), outside))
    return out


def _best_silhouette_up_to(k: int):
    """``distances -> the mean silhouette of steps 1-2 on them, the cut searched over 2 <= K <= k`` (0 where there
    is no such cut). The data's own search ran over every K; the shuffles' stops at the data's K, because shuffled
    distances score their best with many tight pairs (K near N/2: as many small distances as the data has, dealt
    out in pairs), a search the data's cut did not win by (Fashion-MNIST at 80 clients: the groups' cut, K = 5,
    0.426; shuffles searched over every K reached it 3 times in 19)."""
    def score(d: np.ndarray) -> float:
        n = d.shape[0]
        if n <= 2:
            return 0.0
        cut = _start_cut(d, _linkage(d), most=k)
        return float(silhouettes(d, cut).mean()) if 2 <= cut.max() + 1 <= n - 1 else 0.0
    return score


def _kept_by_chance(d: np.ndarray, start: np.ndarray, out: PerCluster) -> list[np.ndarray]:
    """Step 3 of ``auto``: the start cut's clusters where the cut beats chance."""
    # the module's settings are read at each call, so that a benchmark can try others
    test = chance.chance_test(d, silhouettes(d, start).mean(), _best_silhouette_up_to(int(start.max()) + 1),
                              alpha=chance.ALPHA)
    out.tests.append((d.shape[0], test.silhouette, test.p_value))
    kept: list[np.ndarray] = []
    for members, s, _ in _trimmed(d, start):
        if not test.beats_chance:
            if len(members) >= 2:
                out.dissolved += 1
                out.alone_dissolved += members.tolist()
            continue
        out.left += members[s < 0].tolist()
        members = members[s >= 0]
        if len(members) < 2:
            continue
        kept.append(members)
    return kept


def _kept_by_floor(d: np.ndarray, tree: np.ndarray, start: np.ndarray, floor: float, persistence: float,
                   out: PerCluster) -> list[np.ndarray]:
    """Step 3 of ``silhouette_floor``: each cluster kept at a mean silhouette of ``floor`` and a persistence of
    ``persistence``."""
    lasting = _persistence(tree, d.shape[0])
    kept: list[np.ndarray] = []
    for members, s, outside in _trimmed(d, start):
        out.left += members[s < 0].tolist()
        members, outside = members[s >= 0], outside[s >= 0]
        if len(members) >= 2 and _silhouettes(d, members, outside).mean() >= floor and lasting(members) >= persistence:
            kept.append(members)
        else:
            out.dissolved += len(members) >= 2
            out.alone_dissolved += members.tolist() if len(members) >= 2 else []
    return kept


def _identical(d: np.ndarray, alone: np.ndarray) -> list[np.ndarray]:
    """The clients left alone, except that clients at distance 0 from each other (the same pseudo-labels on every
    public sample) stay together: a teacher per copy of one upload would learn the same thing twice."""
    if len(alone) == 0:
        return []
    from scipy.sparse.csgraph import connected_components

    _, component = connected_components(d[np.ix_(alone, alone)] == 0, directed=False)
    return [alone[component == c] for c in range(int(component.max()) + 1)]


def _persistence(tree: np.ndarray, n: int):
    """``members -> persistence``: for the lowest node of the hierarchy that holds all of ``members``, the height
    of its parent over its own (inf for the root)."""
    height = np.concatenate([np.zeros(n), tree[:, 2]])
    parent = np.full(2 * n - 1, -1, dtype=np.int64)
    for k in range(n - 1):
        parent[int(tree[k, 0])] = parent[int(tree[k, 1])] = n + k

    def lasting(members: np.ndarray) -> float:
        path, x = [], int(members[0])  # the lowest common ancestor: the highest point where the others meet the
        while x >= 0:                  # path from the first member to the root
            path.append(x)
            x = int(parent[x])
        pos = {node: depth for depth, node in enumerate(path)}
        lowest = 0
        for i in members[1:]:
            x = int(i)
            while x not in pos:
                x = int(parent[x])
            lowest = max(lowest, pos[x])
        node = path[lowest]
        if parent[node] < 0:
            return math.inf
        return float(height[parent[node]] / height[node]) if height[node] > 0 else math.inf

    return lasting

"""Property tests (hypothesis) of the partitioners and of the clustering.

Partitioners (``cosmos_pl.data.partition``) on random label vectors, class counts, client counts, alphas in
[0.01, 100] and seeds: they terminate, give every sample to exactly one client (none is documented as dropped),
honour ``min_samples_per_client``, repeat themselves for a seed, or raise a user error naming the setting.

Clustering (COSMOS Algorithm 1, ``cosmos_pl.clustering``) on random uploads ``[N, n, M]`` (softmax of random
logits, with identical clients and extreme logits): the distance matrix is finite, symmetric, zero on the
diagonal, non-negative and at most 2 (l1); every B0 rule gives a number >= 0; every client lands in exactly
one cluster, identical clients in the same one; no aggregate holds a NaN.
"""

import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, assume, event, example, given, settings
from hypothesis import strategies as st

from cosmos_pl.aggregation import AGGREGATIONS, aggregate
from cosmos_pl.clustering import cluster_clients, pairwise_distances
from cosmos_pl.data import dirichlet, group_dirichlet, iid
from cosmos_pl.errors import DataError, DivergenceError, UserError

FAST = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def label_vectors(draw):
    """int64 labels [N], 0 <= N <= 300, over 1..12 classes (not every class need be present), mostly long
    enough to partition."""
    num_classes = draw(st.integers(1, 12))
    n = draw(st.one_of(st.integers(0, 300), st.integers(60, 300)))
    return draw(st.lists(st.integers(0, num_classes - 1), min_size=n, max_size=n).map(
        lambda v: np.array(v, dtype=np.int64)))


alphas = st.floats(min_value=0.01, max_value=100.0)
seeds = st.integers(0, 2**32 - 1)


def check_partition(part, labels, num_clients, min_size):
    """Every index of ``labels`` in exactly one client; clients sorted, int64, at least ``min_size`` each."""
    assert part.num_clients == num_clients
    for ix in part.client_indices:
        assert ix.dtype == np.int64 and np.all(np.diff(ix) > 0)
        assert len(ix) >= min_size
    every = np.concatenate(part.client_indices)
    assert np.array_equal(np.sort(every), np.arange(len(labels)))  # none lost, none twice


def run_or_user_error(call):
    """The partition, or None when the call refused with a user error that names a data.* setting."""
    try:
        part = call()
    except UserError as err:  # ConfigError or DataError: one line from the CLI, never a traceback
        assert "data." in str(err), str(err)
        event(f"refused: {type(err).__name__}")
        return None
    event("partitioned")
    return part


@FAST
@given(labels=label_vectors(), num_clients=st.integers(1, 16), alpha=alphas, seed=seeds,
       min_size=st.integers(0, 4))
def test_dirichlet_conserves_and_honours_the_minimum(labels, num_clients, alpha, seed, min_size):
    call = lambda: dirichlet(labels, num_clients, alpha=alpha, min_samples_per_client=min_size, seed=seed)
    part = run_or_user_error(call)
    assume(part is not None)  # a refused request says nothing about conservation
    check_partition(part, labels, num_clients, min_size)
    assert all(np.array_equal(a, b) for a, b in zip(part.client_indices, call().client_indices))


@FAST
@given(labels=label_vectors(), num_clients=st.integers(1, 16), num_groups=st.integers(1, 5), alpha=alphas,
       mix=st.one_of(st.just(0.0), st.floats(0.0, 0.9)), seed=seeds, min_size=st.integers(0, 4))
def test_group_dirichlet_conserves_groups_and_the_minimum(labels, num_clients, num_groups, alpha, mix, seed,
                                                         min_size):
    call = lambda: group_dirichlet(labels, num_clients, num_groups=num_groups, alpha=alpha, mix_fraction=mix,
                                   min_samples_per_client=min_size, seed=seed)
    part = run_or_user_error(call)
    assume(part is not None)  # a refused request says nothing about conservation
    check_partition(part, labels, num_clients, min_size)
    assert part.groups.tolist() == [i % num_groups for i in range(num_clients)]
    grouped = sorted(c for g in part.class_groups for c in g)
    assert grouped == sorted(set(labels.tolist())) and len(part.class_groups) == num_groups  # disjoint, cover
    if mix == 0.0:  # without mixing a client holds only its group's classes
        for i, ix in enumerate(part.client_indices):
            assert set(labels[ix].tolist()) <= set(part.class_groups[part.groups[i]])
    assert all(np.array_equal(a, b) for a, b in zip(part.client_indices, call().client_indices))


@FAST
@given(labels=label_vectors(), num_clients=st.integers(1, 40), seed=seeds)
def test_iid_conserves_with_near_equal_sizes(labels, num_clients, seed):
    part = run_or_user_error(lambda: iid(labels, num_clients, seed=seed))
    if part is None:
        assert num_clients > len(labels)  # the only refusal: a client would be empty
    assume(part is not None)
    check_partition(part, labels, num_clients, 1)
    assert part.sizes.max() - part.sizes.min() <= 1


# --------------------------------------------------------------------------- clustering


@st.composite
def uploads(draw, min_public=1):
    """Pseudo-labels [N, n, M] float32: softmax of random logits at a drawn scale (0 .. 1e30, so rows range
    from exactly uniform to exactly one-hot), and ``source``: clients i and j are identical where source[i] == source[j]."""
    n_clients, n, m = draw(st.integers(1, 8)), draw(st.integers(min_public, 16)), draw(st.integers(2, 10))
    scale = draw(st.sampled_from([0.0, 1e-3, 1.0, 10.0, 1e3, 1e30]))
    rng = np.random.default_rng(draw(seeds))
    base = torch.from_numpy(rng.standard_normal((n_clients, n, m)).astype(np.float32) * np.float32(scale))
    source = draw(st.lists(st.integers(0, n_clients - 1), min_size=n_clients, max_size=n_clients))
    return base[source].softmax(dim=-1), source


def identical_pairs(source):
    return [(i, j) for i in range(len(source)) for j in range(len(source)) if source[i] == source[j]]


@FAST
@given(data=uploads(min_public=0), metric=st.sampled_from(["l1", "l2"]))
def test_distance_matrix_is_a_finite_symmetric_dissimilarity(data, metric):
    p, source = data
    if p.shape[1] == 0:  # an empty U: the mean over U is undefined, so a clear error, never a NaN matrix
        with pytest.raises(DataError, match="data.public_fraction"):
            pairwise_distances(p, metric)
    assume(p.shape[1] > 0)
    d = pairwise_distances(p, metric)
    n_clients = p.shape[0]
    assert d.shape == (n_clients, n_clients) and np.all(np.isfinite(d))
    assert np.array_equal(d, d.T) and np.all(np.diag(d) == 0) and np.all(d >= 0)
    assert np.all(d <= (2.0 if metric == "l1" else math.sqrt(2.0)) + 1e-6)  # two distributions differ by <= 2
    for i, j in identical_pairs(source):
        assert d[i, j] == 0  # identical clients are at distance 0


@FAST
@given(data=uploads(), b0=st.one_of(st.sampled_from(["auto", "strict", "otsu", "inf"]), st.floats(0.0, 2.5)),
       rule=st.sampled_from(AGGREGATIONS))
# found by hypothesis 6.100: the lower median of [1, 0] and [1e-19, 1] sums to 1e-19 and was left off the simplex
@example(data=(torch.tensor([[[1.0, 0.0]], [[1e-19, 1.0]]]), [0, 1]), b0="auto", rule="median")
# six identical clients (uniform rows): every rule must keep them in one cluster
@example(data=(torch.full((6, 5, 4), 0.25), [0] * 6), b0="auto", rule="median")
def test_every_client_in_exactly_one_cluster_and_no_nan(data, b0, rule):
    p, source = data
    d = pairwise_distances(p)
    found = cluster_clients(b0, d)
    assert found.b0 is None if b0 == "auto" else (not math.isnan(found.b0) and found.b0 >= 0)
    clusters = found.clusters
    members = sorted(i for c in clusters for i in c)
    assert members == list(range(p.shape[0])) and all(clusters)  # each exactly once, no empty cluster
    cluster_of = {i: k for k, c in enumerate(clusters) for i in c}
    for i, j in identical_pairs(source):
        assert cluster_of[i] == cluster_of[j]  # identical clients are never split
    if b0 == "inf":
        assert len(clusters) == 1
    for c in clusters:
        agg = aggregate(p[c], rule)
        assert agg.shape == p.shape[1:] and torch.all(torch.isfinite(agg)) and torch.all(agg >= 0)
        assert torch.allclose(agg.sum(dim=1), torch.ones(p.shape[1]), atol=1e-5)


def test_non_finite_uploads_are_refused_naming_the_clients():
    p = torch.full((4, 3, 2), 0.5)
    p[1, 2, 0], p[3, 0, 1] = math.nan, math.inf
    with pytest.raises(DivergenceError, match=r"client\(s\) \[1, 3\] uploaded pseudo-labels holding NaN or inf"):
        pairwise_distances(p)


def test_a_tiny_median_row_is_renormalized_onto_the_simplex():
    # found by the property above: two clients, one public sample; the lower median of [1, 0] and [1e-19, 1]
    # is [1e-19, 0], whose sum 1e-19 > 0, so renormalized it is [1, 0] (the old 1e-12 clamp gave [1e-7, 0])
    p = torch.tensor([[[1.0, 0.0]], [[1e-19, 1.0]]])
    assert torch.allclose(aggregate(p, "median"), torch.tensor([[1.0, 0.0]]))
    # an all-zero median row falls back to the mean: lower median of [1, 0] and [0, 1] is [0, 0] -> [0.5, 0.5]
    assert torch.allclose(aggregate(torch.tensor([[[1.0, 0.0]], [[0.0, 1.0]]]), "median"), torch.tensor([[0.5, 0.5]]))

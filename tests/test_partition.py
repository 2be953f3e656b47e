"""Partitioners: conservation, group structure, mixing, determinism, errors: every call terminates and conserves
the samples (no endless loop or NaN probability when a class runs out), and a seed gives the same partition."""

import json

import numpy as np
import pytest

from cosmos_pl.data import (
    IID,
    Dirichlet,
    GroupDirichlet,
    Partition,
    dirichlet,
    group_dirichlet,
    iid,
)

# 70 samples over 6 classes with uneven class sizes.
LABELS = np.repeat(np.arange(6), [10, 12, 8, 15, 5, 20])

PARTITIONERS = {
    "group_dirichlet": lambda y, n, s: group_dirichlet(y, n, num_groups=3, alpha=1.0, seed=s),
    "dirichlet": lambda y, n, s: dirichlet(y, n, alpha=0.5, seed=s),
    "iid": lambda y, n, s: iid(y, n, seed=s),
}


def assert_conserved(part: Partition, n: int) -> None:
    """Every index 0..n-1 appears in exactly one client; each client's indices sorted int64."""
    for ix in part.client_indices:
        assert ix.dtype == np.int64
        assert np.all(np.diff(ix) > 0)
    allix = np.concatenate(part.client_indices) if part.client_indices else np.zeros(0)
    assert len(allix) == n
    assert np.array_equal(np.sort(allix), np.arange(n))


@pytest.mark.parametrize("name", PARTITIONERS)
def test_every_sample_exactly_once(name):
    part = PARTITIONERS[name](LABELS, 6, 0)
    assert part.num_clients == 6
    assert_conserved(part, len(LABELS))
    assert part.sizes.min() >= 1


@pytest.mark.parametrize("name", PARTITIONERS)
def test_seed_determinism(name):
    a, b, c = (PARTITIONERS[name](LABELS, 6, s) for s in (3, 3, 4))
    assert all(np.array_equal(x, y) for x, y in zip(a.client_indices, b.client_indices))
    assert not all(np.array_equal(x, y) for x, y in zip(a.client_indices, c.client_indices))


def test_iid_sizes_are_array_split():
    # 70 = 6 * 11 + 4: four clients of 12, two of 11.
    assert iid(LABELS, 6, seed=0).sizes.tolist() == [12, 12, 12, 12, 11, 11]


def test_groups_disjoint_without_mixing():
    part = group_dirichlet(LABELS, 7, num_groups=3, alpha=1.0, mix_fraction=0.0, seed=1)
    # 6 classes in 3 groups: sizes from np.array_split are 2, 2, 2 and partition the classes.
    assert sorted(c for g in part.class_groups for c in g) == list(range(6))
    assert [len(g) for g in part.class_groups] == [2, 2, 2]
    assert part.groups.tolist() == [0, 1, 2, 0, 1, 2, 0]  # client i in group i % 3
    for i, ix in enumerate(part.client_indices):
        assert set(LABELS[ix]) <= set(part.class_groups[part.groups[i]])
    # uneven split: 7 classes in 3 groups -> sizes 3, 2, 2
    y7 = np.arange(7).repeat(4)
    assert [len(g) for g in group_dirichlet(y7, 3, num_groups=3, seed=0).class_groups] == [3, 2, 2]


def test_mixing_hand_worked():
    # One client per group and one class per group: before mixing each client holds
    # a whole class, so its size is 25, 14 or 31. Pooled: floor(0.1*25) + floor(0.1*14)
    # + floor(0.1*31) = 2 + 1 + 3 = 6 samples, dealt round-robin: 2 to each client.
    # Final sizes: 25-2+2 = 25, 14-1+2 = 15, 31-3+2 = 30.
    y = np.repeat([0, 1, 2], [25, 14, 31])
    part = group_dirichlet(y, 3, num_groups=3, alpha=1.0, mix_fraction=0.1, seed=5)
    assert_conserved(part, len(y))
    own_class = {i: part.class_groups[part.groups[i]][0] for i in range(3)}
    class_size = {0: 25, 1: 14, 2: 31}
    expected = {25: 25, 14: 15, 31: 30}
    foreign_total = 0
    for i, ix in enumerate(part.client_indices):
        assert len(ix) == expected[class_size[own_class[i]]]
        foreign = int(np.sum(y[ix] != own_class[i]))
        assert foreign <= 2  # at most the 2 pooled samples it received
        foreign_total += foreign
    assert foreign_total <= 6


def test_mixing_matches_unmixed_draw():
    # With min_samples_per_client=0 the first Dirichlet draw is always accepted, and the
    # draw does not depend on mix_fraction, so mix_fraction=0 shows the pre-mix state.
    y = np.repeat(np.arange(10), 30)
    kw = dict(num_groups=5, alpha=2.0, min_samples_per_client=0, seed=7)
    pre = group_dirichlet(y, 10, mix_fraction=0.0, **kw)
    post = group_dirichlet(y, 10, mix_fraction=0.1, **kw)
    assert_conserved(post, len(y))
    pooled = np.floor(0.1 * pre.sizes).astype(int)
    total = int(pooled.sum())
    received = np.array([len(range(j, total, 10)) for j in range(10)])  # pool[j::10]
    assert post.sizes.tolist() == (pre.sizes - pooled + received).tolist()
    for i in range(10):
        kept = np.intersect1d(pre.client_indices[i], post.client_indices[i])
        assert len(kept) >= pre.sizes[i] - pooled[i]
        out_of_group = np.sum(~np.isin(y[post.client_indices[i]], post.class_groups[post.groups[i]]))
        assert out_of_group <= received[i]


@pytest.mark.parametrize(
    "kwargs, n_clients, field",
    [
        (dict(num_groups=3), 2, "num_clients=2"),  # fewer clients than groups
        (dict(num_groups=7), 7, "num_groups=7"),  # more groups than the 6 classes
        (dict(alpha=0.0), 6, "alpha=0.0"),
        (dict(alpha=-1.0), 6, "alpha=-1.0"),
        (dict(mix_fraction=1.0), 6, "mix_fraction=1.0"),
        (dict(mix_fraction=-0.1), 6, "mix_fraction=-0.1"),
        (dict(min_samples_per_client=8), 10, "min_samples_per_client"),  # 80 > 70
        (dict(min_samples_per_client=-1), 6, "min_samples_per_client=-1"),
        (dict(), 0, "num_clients=0"),
    ],
)
def test_group_dirichlet_impossible(kwargs, n_clients, field):
    with pytest.raises(ValueError, match=field):
        group_dirichlet(LABELS, n_clients, **kwargs)


def test_clients_short_after_the_draws_are_topped_up_within_their_group():
    # Class 0 has a single sample; with 2 classes in 2 groups its group has 2 clients and no mixing, so one of
    # them is empty after every draw, and no client of its group can spare a sample: a clear error, as before.
    y = np.array([0] + [1] * 20)
    with pytest.raises(ValueError, match="min_samples_per_client=1 cannot be met.*mix_fraction"):
        group_dirichlet(y, 4, num_groups=2, mix_fraction=0.0, min_samples_per_client=1)
    # 3 samples of class 0 and 20 of class 1, no mixing, alpha 1e-3: within each group one client draws all;
    # the other takes 1 random sample from it, so every client still holds only its group's classes
    y = np.array([0] * 3 + [1] * 20)
    part = group_dirichlet(y, 4, num_groups=2, alpha=1e-3, mix_fraction=0.0, min_samples_per_client=1, seed=0)
    assert_conserved(part, len(y))
    assert sorted(part.sizes.tolist()) == [1, 1, 2, 19]
    for i, ix in enumerate(part.client_indices):
        assert set(y[ix].tolist()) <= set(part.class_groups[part.groups[i]])
    # 3 samples, 3 clients, alpha 1e-3: one client draws everything; the others take one sample each
    part = dirichlet(np.zeros(3, dtype=int), 3, alpha=1e-3, min_samples_per_client=1, seed=0)
    assert sorted(part.sizes.tolist()) == [1, 1, 1]


def test_500_clients_at_alpha_001_meet_the_minimum():
    y = np.repeat(np.arange(100), 100)
    for part in (dirichlet(y, 500, alpha=0.01, seed=0), group_dirichlet(y, 500, alpha=0.01, seed=0)):
        assert_conserved(part, len(y))
        assert min(part.sizes) >= 2


def test_dirichlet_and_iid_impossible():
    with pytest.raises(ValueError, match="alpha=0"):
        dirichlet(LABELS, 3, alpha=0)
    with pytest.raises(ValueError, match="num_clients=0"):
        dirichlet(LABELS, 0)
    with pytest.raises(ValueError, match="min_samples_per_client"):
        dirichlet(LABELS, 8, min_samples_per_client=9)
    with pytest.raises(ValueError, match="num_clients=0"):
        iid(LABELS, 0)
    with pytest.raises(ValueError, match="num_clients"):
        iid(LABELS[:3], 4)  # a client would be empty


def test_tiny_alpha_gives_no_nan():
    part = dirichlet(LABELS, 5, alpha=1e-300, min_samples_per_client=0, seed=0)
    assert_conserved(part, len(LABELS))
    part = group_dirichlet(LABELS, 6, num_groups=2, alpha=1e-300, min_samples_per_client=0, seed=0)
    assert_conserved(part, len(LABELS))


def test_property_random_inputs_terminate_and_conserve():
    rng = np.random.default_rng(123)
    outcomes = {"ok": 0, "error": 0}
    for case in range(50):
        n = int(rng.integers(0, 200))
        y = rng.integers(0, int(rng.integers(1, 13)), size=n)
        alpha = float(rng.choice([1e-3, 0.1, 1.0, 10.0, 1e3]))
        clients = int(rng.integers(1, 16))
        calls = [
            lambda: group_dirichlet(
                y, clients, num_groups=int(rng.integers(1, 7)), alpha=alpha,
                mix_fraction=float(rng.choice([0.0, 0.1, 0.5])),
                min_samples_per_client=int(rng.choice([0, 1, 3])), seed=case),
            lambda: dirichlet(y, clients, alpha=alpha, min_samples_per_client=int(rng.choice([0, 1, 3])), seed=case),
            lambda: iid(y, clients, seed=case),
        ]
        for call in calls:
            try:
                part = call()
            except ValueError:
                outcomes["error"] += 1
                continue
            outcomes["ok"] += 1
            assert part.num_clients == clients
            assert_conserved(part, n)
    assert outcomes["ok"] > 0 and outcomes["error"] > 0  # both branches exercised


def test_class_counts_and_json():
    y = np.array([0, 1, 0, 2, 1])
    part = Partition([np.array([0, 2]), np.array([1, 3, 4])])
    assert part.class_counts(y, 3).tolist() == [[2, 0, 0], [0, 2, 1]]
    js = part.to_json(y, 3)
    assert js == {
        "num_clients": 2, "groups": None, "class_groups": None,
        "class_counts": [[2, 0, 0], [0, 2, 1]], "sizes": [2, 3],
    }
    gd = group_dirichlet(LABELS, 6, num_groups=3, seed=0).to_json(LABELS, 6)
    json.dumps(gd)  # serialisable
    assert sum(gd["sizes"]) == 70 and gd["groups"] == [0, 1, 2, 0, 1, 2]


def test_config_classes_match_functions():
    pairs = [
        (GroupDirichlet(num_groups=2, alpha=0.3, mix_fraction=0.2), lambda s: group_dirichlet(LABELS, 4, num_groups=2, alpha=0.3, mix_fraction=0.2, seed=s)),
        (Dirichlet(alpha=0.3), lambda s: dirichlet(LABELS, 4, alpha=0.3, seed=s)),
        (IID(), lambda s: iid(LABELS, 4, seed=s)),
    ]
    for obj, fn in pairs:
        a, b = obj(LABELS, 4, 9), fn(9)
        assert all(np.array_equal(x, z) for x, z in zip(a.client_indices, b.client_indices))

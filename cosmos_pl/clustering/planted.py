"""Planted federations: pseudo-label uploads ``[N, n, M]`` of clients in known class groups, with overlap between
groups as a parameter, for measuring how a clustering rule recovers the groups (``benchmarks/cluster_recovery.py``,
``benchmarks/server_scale.py``). Nothing here is used by a run.

The generator follows the label-skew setting of the COSMOS paper (Section 6): the M classes are split into G
disjoint class groups and every client belongs to one group. On a public sample of class y, client i's upload is

- for a class it knows (its group's classes, and the foreign classes it learnt): its competence ``c_i`` on y
  (half of it on a learnt foreign class), the rest spread evenly over the classes it knows;
- for a class it never saw: a guess among the classes it knows, mixing its group's shared confusion (clients
  trained on the same classes confuse an unknown class alike) with a confusion of its own;

then soft-label noise: Gaussian noise on the log-probabilities before a softmax. ``overlap`` in [0, 1] moves every
source of disagreement inside a group and of agreement between groups at once:

====================================  =======================  ===================
per client                            overlap 0                 overlap 1
====================================  =======================  ===================
competence ``c_i``                    U(0.95, 0.98)             U(0.35, 0.98)
share of foreign classes learnt       U(0, 0.1) per client      U(0, 0.8) per client
weight of its own confusion            0.1                       0.6
noise on the log-probabilities (sd)   0.2                       0.8
====================================  =======================  ===================

Measured on the L1 distances per public sample (G = 5, M = 20, n = 400, seed 1): at overlap 0 within-group
distances 0.15-0.60, between 1.6-1.97, no between-group pair closer than the farthest within-group pair; at 0.5,
0.4-1.2 and 1.1-1.97 (0.2 % of the between pairs closer, at 100 clients); at 0.75 about 6-10 %; at 1.0, 12 % at 20
clients and 44 % at 100. The configs' real uploads lie between 0.5 and 1.0 (Fashion-MNIST at 20 clients: 0-15 %;
digits: 25-45 %).
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch

__all__ = ["planted_uploads"]


def planted_uploads(num_clients: int, num_groups: int = 5, num_classes: int = 20, public: int = 200,
                    overlap: float = 0.5, seed: int = 0, competence: Optional[tuple[float, float]] = None,
                    foreign: Optional[float] = None, noise: Optional[float] = None) -> tuple[torch.Tensor, np.ndarray]:
    """A planted federation's pseudo-labels on U and its true groups (see the module docstring).

    Args:
        num_clients: N.
        num_groups: G class groups (and client groups); clients are dealt to groups evenly, in a random order.
        num_classes: M, split into G disjoint class groups.
        public: n, the public samples (their classes uniform over M).
        overlap: in [0, 1]: how much the groups' uploads overlap.
        seed: seed of ``np.random.default_rng``: the same arguments give the same uploads.
        competence: ``(low, high)``: each client's competence ``c_i`` uniform in it, instead of the overlap's.
        foreign: the largest share of foreign classes a client learns (each client's share uniform in
            ``[0, foreign]``), instead of the overlap's.
        noise: the sd of the noise on the log-probabilities, instead of the overlap's.

    Returns:
        ``(uploads, groups)``: float32 ``[N, n, M]`` (rows on the simplex) and int ``[N]``. Memory: ``4 N n M``
        bytes (N = 2,000, n = 200, M = 20: 32 MB).

    Raises:
        ValueError: ``overlap`` outside [0, 1], or fewer classes than groups, or fewer clients than groups, or a
            ``competence`` not within [0, 1] in order, a ``foreign`` outside [0, 1], a negative ``noise``.
    """
    if not 0.0 <= overlap <= 1.0:
        raise ValueError(f"overlap={overlap}: must lie in [0, 1]")
    if competence is not None and not 0.0 <= competence[0] <= competence[1] <= 1.0:
        raise ValueError(f"competence={competence}: give (low, high) with 0 <= low <= high <= 1")
    if foreign is not None and not 0.0 <= foreign <= 1.0:
        raise ValueError(f"foreign={foreign}: must lie in [0, 1]")
    if noise is not None and noise < 0:
        raise ValueError(f"noise={noise}: must be >= 0")
    if num_classes < num_groups or num_clients < num_groups:
        raise ValueError(f"num_classes={num_classes} and num_clients={num_clients} must each be >= "
                         f"num_groups={num_groups}")
    rng = np.random.default_rng(seed)
    blocks = np.array_split(rng.permutation(num_classes), num_groups)
    groups = rng.permutation(np.arange(num_clients) % num_groups)
    y = rng.integers(0, num_classes, public)
    shared = [rng.dirichlet(np.ones(len(b)), size=num_classes) for b in blocks]  # a group's confusion [M, |b|]
    own_weight = 0.1 + 0.5 * overlap
    noise = 0.2 + 0.6 * overlap if noise is None else noise
    low, high = (0.95 - 0.6 * overlap, 0.98) if competence is None else competence
    most_foreign = 0.1 + 0.7 * overlap if foreign is None else foreign
    rows = np.arange(public)
    out = np.empty((num_clients, public, num_classes), dtype=np.float32)
    for i in range(num_clients):
        g = int(groups[i])
        own = blocks[g]
        others = np.setdiff1d(np.arange(num_classes), own)
        learnt = others[rng.random(len(others)) < rng.uniform(0, most_foreign)]
        known = np.concatenate([own, learnt])
        c_i = rng.uniform(low, high)
        on_y = np.where(np.isin(y, own), c_i, 0.5 * c_i)
        confusion = rng.dirichlet(np.ones(len(known)), size=num_classes)  # the client's own [M, |known|]
        knows = np.zeros((public, num_classes))
        knows[:, known] = ((1 - on_y) / len(known))[:, None]
        knows[rows, y] += on_y
        guess = np.zeros((public, num_classes))
        guess[:, own] = (1 - own_weight) * shared[g][y]
        guess[:, known] += own_weight * confusion[y]
        mean = np.where(np.isin(y, known)[:, None], knows, guess)
        logits = np.log(mean + 1e-3) + noise * rng.standard_normal((public, num_classes))
        e = np.exp(logits - logits.max(axis=1, keepdims=True))
        out[i] = e / e.sum(axis=1, keepdims=True)
    return torch.from_numpy(out), groups

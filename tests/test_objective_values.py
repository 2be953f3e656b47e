"""Objectives checked against values worked out by hand or by brute force.

- COMET's joint client loss (:class:`~cosmos_pl.objectives.joint.JointModule`): ``CE(f(T(x)), y) + lam * mean_u KL(t || f(u))``
  on a batch whose logits are fixed, each term written out with ``math.log``.
- The separated clusterings behind ``b0: strict`` (the best-silhouette separated clustering, formerly ``auto``):
  the thresholds the code enumerates give exactly the clusterings a brute force over every set partition of N <= 7
  clients finds separated, and the rule picks the brute force's best one.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from sklearn.metrics import silhouette_score
from torch import nn

from cosmos_pl.clustering import cluster_clients, greedy_labels
from cosmos_pl.clustering.threshold import WEAK_SILHOUETTE, separated_candidates
from cosmos_pl.objectives.joint import JointModule


# --------------------------------------------------------------------------- COMET's joint loss
class PixelLogits(nn.Module):
    """Logits looked up by each image's first pixel value (0..255): the loss's inputs are fixed whatever the order
    in which the module puts x and u through the backbone."""

    def __init__(self, rows: dict[int, list[float]]) -> None:
        super().__init__()
        table = torch.zeros(256, 3)
        for pixel, logits in rows.items():
            table[pixel] = torch.tensor(logits)
        self.table = nn.Parameter(table)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pixel = ((x[:, 0, 0, 0] + 1) / 2 * 255).round().long()  # the model input is (p / 255 - 0.5) / 0.5
        return self.table[pixel]


def _log(p: list[float]) -> list[float]:
    return [math.log(v) for v in p]


def _images(first_pixels: list[int]) -> torch.Tensor:
    x = torch.zeros(len(first_pixels), 1, 2, 2, dtype=torch.uint8)
    x[:, 0, 0, 0] = torch.tensor(first_pixels, dtype=torch.uint8)
    return x


def test_comet_joint_loss_is_cross_entropy_plus_lambda_times_the_mean_forward_kl():
    """f(x) = softmax(logits): x1 -> (0.5, 0.25, 0.25) with y = 0, x2 -> (0.2, 0.3, 0.5) with y = 1;
    u1 -> (0.5, 0.25, 0.25) with t = (0.8, 0.1, 0.1), u2 -> (0.2, 0.3, 0.5) with t = (0.1, 0.6, 0.3).

    CE = (-ln 0.5 - ln 0.3) / 2. KL(t || f) (target first, as in Eq. 2):
    u1: 0.8 ln(0.8 / 0.5) + 0.1 ln(0.1 / 0.25) + 0.1 ln(0.1 / 0.25); u2: 0.1 ln(0.1 / 0.2) + 0.6 ln(0.6 / 0.3) +
    0.3 ln(0.3 / 0.5); the loss averages them over the U batch. A reversed KL(f || t), a sum over U, or lambda
    ignored each give another number (asserted below, so the check can tell them apart)."""
    lam = 2.5
    probs = {10: [0.5, 0.25, 0.25], 20: [0.2, 0.3, 0.5], 30: [0.5, 0.25, 0.25], 40: [0.2, 0.3, 0.5]}
    module = JointModule(PixelLogits({k: _log(p) for k, p in probs.items()}), lambda ps: torch.optim.SGD(ps, lr=0.1),
                         transformations=None, lam=lam)
    x, y = _images([10, 20]), torch.tensor([0, 1])
    u = _images([30, 40])
    t = torch.tensor([[0.8, 0.1, 0.1], [0.1, 0.6, 0.3]])
    loss = module.training_step((x, y, u, t), 0)

    ce = (-math.log(0.5) - math.log(0.3)) / 2
    kl_u1 = 0.8 * math.log(0.8 / 0.5) + 0.1 * math.log(0.1 / 0.25) + 0.1 * math.log(0.1 / 0.25)
    kl_u2 = 0.1 * math.log(0.1 / 0.2) + 0.6 * math.log(0.6 / 0.3) + 0.3 * math.log(0.3 / 0.5)
    expected = ce + lam * (kl_u1 + kl_u2) / 2
    assert float(loss.detach()) == pytest.approx(expected, rel=1e-5)

    reversed_kl = (0.5 * math.log(0.5 / 0.8) + 2 * 0.25 * math.log(0.25 / 0.1)
                   + 0.2 * math.log(0.2 / 0.1) + 0.3 * math.log(0.3 / 0.6) + 0.5 * math.log(0.5 / 0.3)) / 2
    for wrong in (ce + lam * reversed_kl, ce + (kl_u1 + kl_u2) / 2, ce + lam * (kl_u1 + kl_u2)):
        assert abs(wrong - expected) > 1e-2

    loss.backward()  # the loss reaches the backbone: both the x rows and the u rows get a gradient
    touched = module.backbone.table.grad.abs().sum(dim=1).nonzero().flatten().tolist()
    assert touched == [10, 20, 30, 40]


# --------------------------------------------------------------------------- separated clusterings, brute force
def _set_partitions(n: int) -> np.ndarray:
    """Every set partition of n items as canonical labels ``[Bell(n), n]`` (restricted growth strings)."""
    out = [[0]]
    for _ in range(1, n):
        out = [p + [k] for p in out for k in range(max(p) + 2)]
    return np.array(out, dtype=np.int64)


def _canonical(labels: np.ndarray) -> tuple[int, ...]:
    """Labels renumbered in order of first appearance."""
    seen: dict[int, int] = {}
    return tuple(seen.setdefault(int(v), len(seen)) for v in labels)


def _brute_force_separated(d: np.ndarray, partitions: np.ndarray) -> list[tuple[tuple[int, ...], float]]:
    """``(labels, farthest within-cluster distance)`` of every partition with 2 <= K <= N - 1 whose every
    within-cluster distance is below every between-cluster distance, straight from the definition."""
    n = d.shape[0]
    out = []
    off = ~np.eye(n, dtype=bool)
    for labels in partitions:
        k = labels.max() + 1
        if not 2 <= k <= n - 1:
            continue
        same = labels[:, None] == labels[None, :]
        within, between = d[same & off], d[~same]
        if within.max() < between.min():
            out.append((tuple(int(v) for v in labels), float(within.max())))
    return out


def _distance_matrices(seed: int, n: int) -> list[np.ndarray]:
    """Three kinds of symmetric distance matrices with a zero diagonal: uniform noise, points around planted
    centres (groups that are often, not always, separated), and those distances rounded up to whole numbers (many
    ties)."""
    rng = np.random.default_rng(seed)
    uniform = rng.uniform(0.1, 1.0, (n, n))
    groups = rng.integers(0, rng.integers(1, n) + 1, n)
    centres = rng.normal(0, 3.0, (n, 2))
    points = centres[groups] + rng.normal(0, rng.uniform(0.3, 2.0), (n, 2))
    planted = np.sqrt(((points[:, None] - points[None]) ** 2).sum(-1)) + 1e-3
    ties = np.ceil(planted)
    out = []
    for m in (uniform, planted, ties):
        m = np.triu(m, 1)
        out.append(m + m.T)
    return out


@pytest.mark.parametrize("n", [3, 4, 5, 6, 7])
def test_the_enumerated_separated_clusterings_are_exactly_those_a_brute_force_finds(n):
    """For N <= 7 every set partition is tried (Bell(7) = 877): the thresholds ``separated_candidates`` returns,
    each turned into Algorithm 1's clustering, must be the separated clusterings with 2 <= K <= N - 1, each once;
    ``b0: strict`` must pick the one with the best silhouette (ties: the smaller farthest within-cluster distance)
    when that silhouette reaches 0.25, else leave every client alone."""
    partitions = _set_partitions(n)
    assert len(partitions) == [1, 1, 2, 5, 15, 52, 203, 877][n]
    for seed in range(25):
        for d in _distance_matrices(1000 * n + seed, n):
            expected = _brute_force_separated(d, partitions)
            thresholds = separated_candidates(d)
            found = [_canonical(greedy_labels(d, t)) for t in thresholds]
            assert len(found) == len(set(found))
            assert set(found) == {labels for labels, _ in expected}, (d, thresholds)
            for t, labels in zip(thresholds, found):  # each threshold is its clustering's farthest within distance
                assert t == dict(expected)[labels]

            scored = [(silhouette_score(d, np.array(labels), metric="precomputed"), within, labels)
                      for labels, within in expected]
            best = max(s for s, _, _ in scored) if scored else -math.inf
            chosen = cluster_clients("strict", d)
            if best >= WEAK_SILHOUETTE:
                winner = min((within, labels) for s, within, labels in scored if s >= best - 1e-12)[1]
                assert _canonical(chosen.labels) == winner
            else:  # no zero distance here: every client alone
                assert _canonical(chosen.labels) == tuple(range(n))

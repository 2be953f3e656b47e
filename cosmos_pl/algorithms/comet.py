"""COMET: clustered knowledge transfer with K-means over the clients' soft labels.

Source: Y. J. Cho, J. Wang, T. Chiruvolu, G. Joshi, "Communication-Efficient and Model-Heterogeneous Personalized
Federated Learning via Clustered Knowledge Transfer", IEEE Journal of Selected Topics in Signal Processing 17(1),
234-247, 2023. Each round clients upload soft labels on the public set; the server runs K-means with a given K on
them and sends each client its cluster's mean soft labels; each client then learns from them:
- ``mode: joint`` (the default): one objective, local cross-entropy plus lambda times the KL distillation to the
  cluster mean on U (COMET's Eq. as published);
- ``mode: sequential``: first KL distillation on U toward the cluster mean (``clients.distill_epochs``), then
  cross-entropy on D_i (``epochs``), as the COMET baseline in the COSMOS authors' code runs it (lambda unused).

K-means: scikit-learn ``KMeans`` on each client's flattened ``[n * M]`` soft-label matrix, seeded from the stage
seed (round, "kmeans"); with fewer uploads than K, K is the number of uploads. ``warm_start``: from the second
clustering on, K-means starts from the previous round's centroids (one run, no restarts), as in the COSMOS authors'
COMET; the first clustering, and any round whose K differs from the previous one, starts fresh.
``mode: sequential`` with ``warm_start: true`` is that baseline.

Scored model: the client model f_i.
"""

from __future__ import annotations

import math
import warnings
from typing import TYPE_CHECKING, Any, Literal, Optional

import numpy as np
import torch

from cosmos_pl.algorithms.base import Algorithm, ServerResult, check_setting
from cosmos_pl.communication import pseudo_label_bytes
from cosmos_pl.training.config import register_stage

if TYPE_CHECKING:
    from cosmos_pl.algorithms.base import Step

__all__ = ["assignment_info", "COMET", "kmeans", "kmeans_clusters"]

register_stage("kmeans", 7)  # seeds each round's K-means


def kmeans(uploads: dict[int, torch.Tensor], k: int, seed: int, n_init: int = 10,
           init: Optional[torch.Tensor] = None) -> tuple[dict[int, int], torch.Tensor]:
    """K-means over clients' soft-label matrices ``{i: [n, M]}``: client id -> cluster in ``[0, K)``, and the
    centroids float64 ``[K, n * M]`` in that numbering.

    Cluster ids are renumbered in order of each cluster's lowest client id, so the result does not depend on
    scikit-learn's label order. ``init``: centroids ``[K, n * M]`` to start from (one run from them, no restarts);
    ignored when K (after capping at the number of uploads) or the width differs.
    """
    from sklearn.cluster import KMeans
    from sklearn.exceptions import ConvergenceWarning

    ids = sorted(uploads)
    x = torch.stack([uploads[i].flatten() for i in ids]).double().numpy()
    k = min(k, len(ids))
    with warnings.catch_warnings():
        # fewer distinct points than K (e.g. identical uploads) is a result, not a fault: the labels say it
        warnings.simplefilter("ignore", ConvergenceWarning)
        if init is not None and tuple(init.shape) == (k, x.shape[1]):
            fitted = KMeans(n_clusters=k, init=init.double().numpy(), n_init=1, random_state=seed).fit(x)
        else:
            fitted = KMeans(n_clusters=k, n_init=n_init, random_state=seed).fit(x)
    order: dict[int, int] = {}
    for lab in fitted.labels_:
        order.setdefault(int(lab), len(order))
    centers = np.zeros_like(fitted.cluster_centers_)
    for old, new in order.items():
        centers[new] = fitted.cluster_centers_[old]
    return {i: order[int(lab)] for i, lab in zip(ids, fitted.labels_)}, torch.from_numpy(centers[:len(order)])


def assignment_info(assignment: list[Optional[int]], num_clusters: int) -> Optional[dict[str, Any]]:
    """What clusters.json records of a given-K clustering (COMET, pFedCK): K found, K set, the assignment per client
    (-1: in no cluster) and each cluster's members; None before any client was assigned."""
    if all(a is None for a in assignment):
        return None
    k = max(a for a in assignment if a is not None) + 1
    return {"K": k, "K_setting": num_clusters, "assignment": [-1 if a is None else a for a in assignment],
            "clusters": [[i for i, a in enumerate(assignment) if a == c] for c in range(k)]}


def kmeans_clusters(uploads: dict[int, torch.Tensor], k: int, seed: int, n_init: int = 10) -> dict[int, int]:
    """:func:`kmeans`'s assignment alone (client id -> cluster), from a fresh start."""
    return kmeans(uploads, k, seed, n_init)[0]


class COMET(Algorithm):
    """K-means (given K) on uploaded soft labels; clients learn from their cluster's mean.

    Args:
        num_clusters: K, the number of clusters (COMET needs it in advance; COSMOS finds it).
        lambda_: weight of the distillation term in the clients' joint objective (``mode: joint`` only).
        epochs: epochs over D_i per round (joint: each step with a batch of U); null uses clients.local_epochs.
        n_init: K-means restarts (a fresh start; a warm start runs once).
        mode: 'joint' (CE + lambda KL in one objective) or 'sequential' (distill on U, then CE on D_i).
        warm_start: start K-means from the previous round's centroids.
    """

    name = "comet"

    def __init__(self, num_clusters: int = 5, lambda_: float = 1.0, epochs: Optional[int] = None,
                 n_init: int = 10, mode: Literal["joint", "sequential"] = "joint", warm_start: bool = False) -> None:
        check_setting("num_clusters", num_clusters, num_clusters >= 1, ">= 1")
        check_setting("lambda_", lambda_, math.isfinite(lambda_) and lambda_ >= 0, "finite and >= 0")
        check_setting("epochs", epochs, epochs is None or epochs >= 0, ">= 0 or null")
        check_setting("n_init", n_init, n_init >= 1, ">= 1")
        check_setting("mode", mode, mode in ("joint", "sequential"), "'joint' or 'sequential'")
        self.num_clusters, self.lambda_, self.epochs, self.n_init = num_clusters, lambda_, epochs, n_init
        self.mode, self.warm_start = mode, warm_start
        self.centroids: Optional[torch.Tensor] = None  # [K, n * M], the last clustering's (for the warm start)

    def setup(self, ctx) -> None:
        super().setup(ctx)
        self.assignment: list[Optional[int]] = [None] * ctx.num_clients
        if self.num_clusters > ctx.num_clients:
            ctx.log(f"warning: algorithm.init_args.num_clusters={self.num_clusters} exceeds data.num_clients="
                    f"{ctx.num_clients}: COMET uses K = {ctx.num_clients} (one client per cluster); lower num_clusters")

    def plan(self, rnd: int) -> list[Step]:
        from cosmos_pl.objectives.distill import Distill
        from cosmos_pl.objectives.joint import JointFit
        from cosmos_pl.objectives.local_fit import LocalFit
        from cosmos_pl.objectives.protocol import Upload

        local = self.ctx.local_epochs if self.epochs is None else self.epochs
        if self.mode == "sequential":
            return [Upload("soft"), Distill(self.ctx.distill_epochs), LocalFit(local)]
        return [Upload("soft"), JointFit(local, self.lambda_)]

    def server_step(self, rnd: int, uploads: dict[int, torch.Tensor]) -> ServerResult:
        if len(uploads) < self.num_clusters <= self.ctx.num_clients:  # clients failed this round
            self.ctx.log(f"round {rnd}: COMET: only {len(uploads)} clients uploaded, fewer than num_clusters="
                         f"{self.num_clusters}: K = {len(uploads)} this round")
        found, centroids = kmeans(uploads, self.num_clusters, self.ctx.stage_seed(rnd, "kmeans", 0), self.n_init,
                                  self.centroids if self.warm_start else None)
        self.centroids = centroids
        self.assignment = [found.get(i) for i in range(self.ctx.num_clients)]
        targets = {}
        for k in sorted(set(found.values())):
            members = [i for i, c in found.items() if c == k]
            mean = torch.stack([uploads[i] for i in members]).float().mean(dim=0)
            targets.update({i: mean for i in members})
        n, m = next(iter(uploads.values())).shape
        return ServerResult(targets, pseudo_label_bytes(n, m))

    def cluster_of(self, client: int) -> Optional[int]:
        return self.assignment[client]

    def clustering_info(self) -> Optional[dict[str, Any]]:
        return assignment_info(self.assignment, self.num_clusters)

    def state_dict(self) -> dict[str, Any]:
        return {"assignment": self.assignment, "centroids": self.centroids}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.assignment = list(state["assignment"])
        self.centroids = state.get("centroids")  # absent in a checkpoint from before the warm start

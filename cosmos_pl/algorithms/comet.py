"""COMET: clustered knowledge transfer with K-means over the clients' soft labels.

Source: Y. J. Cho, J. Wang, T. Chirvolu, G. Joshi, "Communication-Efficient and Model-Heterogeneous Personalized
Federated Learning via Clustered Knowledge Transfer" (COMET), IEEE Journal of Selected Topics in Signal
Processing, 2023. Each round clients upload soft labels on the public set; the server runs K-means with a given K
on them and sends each client its cluster's mean soft labels; each client then trains on its local cross-entropy
plus lambda times the distillation loss to those labels on the public set.

K-means: scikit-learn ``KMeans`` on each client's flattened ``[n * M]`` soft-label matrix, seeded from the stage
seed (round, "kmeans"); with fewer uploads than K, K is the number of uploads.

Scored model: the client model f_i.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import torch

from cosmos_pl.algorithms.base import Algorithm, JointFit, ServerResult, Step, Upload, check_setting
from cosmos_pl.communication import pseudo_label_bytes

__all__ = ["COMET", "kmeans_clusters"]


def kmeans_clusters(uploads: dict[int, torch.Tensor], k: int, seed: int, n_init: int = 10) -> dict[int, int]:
    """K-means over clients' soft-label matrices ``{i: [n, M]}``; returns client id -> cluster in ``[0, K)``.

    Cluster ids are renumbered in order of each cluster's lowest client id, so the result does not depend on
    scikit-learn's label order.
    """
    from sklearn.cluster import KMeans

    ids = sorted(uploads)
    x = torch.stack([uploads[i].flatten() for i in ids]).double().numpy()
    k = min(k, len(ids))
    labels = KMeans(n_clusters=k, n_init=n_init, random_state=seed).fit_predict(x)
    order = {}
    for lab in labels:
        order.setdefault(int(lab), len(order))
    return {i: order[int(lab)] for i, lab in zip(ids, labels)}


class COMET(Algorithm):
    """K-means (given K) on uploaded soft labels; clients train ``CE + lambda * KL`` to their cluster's mean.

    Args:
        num_clusters: K, the number of clusters (COMET needs it in advance; COSMOS finds it).
        lambda_: weight of the distillation term in the clients' objective.
        epochs: epochs over D_i (each step with a batch of U) per round; null uses clients.local_epochs.
        n_init: K-means restarts.
    """

    name = "comet"

    def __init__(self, num_clusters: int = 5, lambda_: float = 1.0, epochs: Optional[int] = None,
                 n_init: int = 10) -> None:
        check_setting("num_clusters", num_clusters, num_clusters >= 1, ">= 1")
        check_setting("lambda_", lambda_, math.isfinite(lambda_) and lambda_ >= 0, "finite and >= 0")
        check_setting("epochs", epochs, epochs is None or epochs >= 0, ">= 0 or null")
        check_setting("n_init", n_init, n_init >= 1, ">= 1")
        self.num_clusters, self.lambda_, self.epochs, self.n_init = num_clusters, lambda_, epochs, n_init

    def setup(self, ctx) -> None:
        super().setup(ctx)
        self.assignment: list[Optional[int]] = [None] * ctx.num_clients
        if self.num_clusters > ctx.num_clients:
            ctx.log(f"warning: algorithm.init_args.num_clusters={self.num_clusters} exceeds data.num_clients="
                    f"{ctx.num_clients}: COMET uses K = {ctx.num_clients} (one client per cluster); lower num_clusters")

    def plan(self, rnd: int) -> list[Step]:
        return [Upload("soft"), JointFit(self.ctx.local_epochs if self.epochs is None else self.epochs, self.lambda_)]

    def server_step(self, rnd: int, uploads: dict[int, torch.Tensor]) -> ServerResult:
        if len(uploads) < self.num_clusters <= self.ctx.num_clients:  # clients failed this round
            self.ctx.log(f"round {rnd}: COMET: only {len(uploads)} clients uploaded, fewer than num_clusters="
                         f"{self.num_clusters}: K = {len(uploads)} this round")
        found = kmeans_clusters(uploads, self.num_clusters, self.ctx.stage_seed(rnd, "kmeans", 0), self.n_init)
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
        if all(a is None for a in self.assignment):
            return None
        k = max(a for a in self.assignment if a is not None) + 1
        return {"K": k, "K_setting": self.num_clusters, "assignment": [-1 if a is None else a for a in self.assignment],
                "clusters": [[i for i, a in enumerate(self.assignment) if a == c] for c in range(k)]}

    def state_dict(self) -> dict[str, Any]:
        return {"assignment": self.assignment}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.assignment = list(state["assignment"])

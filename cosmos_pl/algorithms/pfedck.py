"""pFedCK: personalized models beside interactive models clustered by their updates (homogeneous clients only).

Source: J. Zhang, Y. Shi, "A Personalized Federated Learning Method Based on Clustering and Knowledge
Distillation", Electronics (MDPI) 2024 (reference [33] of the COSMOS paper; no official code). Each client holds a
personalized model phi_i, only trained locally, and an interactive model omega_i, which takes part in global training
(:class:`~cosmos_pl.models.interactive.PersonalAndInteractive`). In a round, a client taking part
1. trains both by mutual distillation on D_i for ``epochs`` epochs: each learns from the labels, from the other's
   soft predictions at temperature T (weight a) and from the other's middle-layer features (weight b)
   (:class:`~cosmos_pl.objectives.mutual.MutualFit`);
2. sends Delta omega_i, the change of omega_i since the server last updated it;
3. the server clusters the clients by their Delta omega_i (K-means, K = ``num_clusters``, on the flattened
   updates, Euclidean) and sends each client its cluster's unweighted mean update; the client sets
   ``omega_i <- omega_i^start + mean Delta`` (members with a common start, as in the first federated round or while
   the clusters stay the same, then hold one omega: FedAvg within the cluster).
Round 0 (every algorithm's E0 local epochs) trains phi_i alone, so every omega_i starts from the shared
initialization.

Defaults: the article's values of K, T, a, b and its clustering metric could not be read here; the defaults are
those of the COSMOS authors' pFedCK (``Client_pFedCK``/``Server_pFedCK`` of benrachmut/cluster_fed_learning:
T = 2, a = b = 0.5, scikit-learn K-means with K = 5 and 10 restarts on the raw updates, unweighted cluster means),
the implementation behind the COSMOS paper's Table 7. It differs from that code in two places, both to follow the
article: the cluster's mean update replaces the client's own (the reference adds it on top of the already trained
omega_i, counting the client's update twice), and omega_i starts from one initialization on every client (the
reference initializes each client's omega_i on its own). Each round's K-means is seeded from the stage seed
(round, "kmeans"); with fewer uploads than K, K is the number of uploads.

Scored model: the personalized model phi_i. Bytes: Delta omega_i up (every float tensor of omega_i, BatchNorm
statistics included) and the cluster's mean update down, both the size of the model's float state.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Optional

import torch
from torch import nn

from cosmos_pl.algorithms.base import Algorithm, ServerResult, check_setting
from cosmos_pl.algorithms.comet import assignment_info, kmeans
from cosmos_pl.algorithms.fedavg import require_one_backbone
from cosmos_pl.communication import state_dict_bytes
from cosmos_pl.models.interactive import PersonalAndInteractive

if TYPE_CHECKING:
    from cosmos_pl.algorithms.base import Step

__all__ = ["PFedCK", "cluster_means"]


def cluster_means(uploads: dict[int, dict[str, torch.Tensor]], assignment: dict[int, int]
                  ) -> dict[int, dict[str, torch.Tensor]]:
    """Each client's target: the unweighted mean, over the members of its cluster, of every uploaded tensor
    (computed in float64, returned in the upload's dtype; one dict shared by a cluster's members).

    Args:
        uploads: client id -> its update ``{key: tensor}`` (the same keys and shapes for every client).
        assignment: client id -> cluster, for every client in ``uploads``.
    """
    targets: dict[int, dict[str, torch.Tensor]] = {}
    for k in sorted(set(assignment.values())):
        members = sorted(i for i, c in assignment.items() if c == k)
        first = uploads[members[0]]
        mean = {key: (sum(uploads[i][key].double() for i in members) / len(members)).to(t.dtype)
                for key, t in first.items()}
        targets.update({i: mean for i in members})
    return targets


class PFedCK(Algorithm):
    """Mutual distillation of two models per client; the interactive models' updates averaged within K-means clusters.

    Args:
        num_clusters: K, the clusters of each round's K-means (COSMOS authors' code: 5).
        temperature: T > 0 of the soft predictions distilled (COSMOS authors' code: 2).
        kl_weight: a >= 0, the weight of ``T^2 * KL`` between the two models' soft predictions (COSMOS authors'
            code: 0.5).
        feature_weight: b >= 0, the weight of the MSE between the two models' pre-logits features (COSMOS
            authors' code: 0.5).
        epochs: epochs of mutual distillation per round; null uses clients.local_epochs.
        n_init: K-means restarts (COSMOS authors' code: scikit-learn's 10).
    """

    name = "pfedck"
    shared_init = True
    uses_public = False

    def __init__(self, num_clusters: int = 5, temperature: float = 2.0, kl_weight: float = 0.5,
                 feature_weight: float = 0.5, epochs: Optional[int] = None, n_init: int = 10) -> None:
        check_setting("num_clusters", num_clusters, num_clusters >= 1, ">= 1")
        check_setting("temperature", temperature, math.isfinite(temperature) and temperature > 0, "finite and > 0")
        check_setting("kl_weight", kl_weight, math.isfinite(kl_weight) and kl_weight >= 0, "finite and >= 0")
        check_setting("feature_weight", feature_weight, math.isfinite(feature_weight) and feature_weight >= 0,
                      "finite and >= 0")
        check_setting("epochs", epochs, epochs is None or epochs >= 0, ">= 0 or null")
        check_setting("n_init", n_init, n_init >= 1, ">= 1")
        self.num_clusters, self.temperature, self.kl_weight = num_clusters, temperature, kl_weight
        self.feature_weight, self.epochs, self.n_init = feature_weight, epochs, n_init
        self.assignment: list[Optional[int]] = []

    def validate(self, backbones: list[str]) -> None:
        require_one_backbone("pFedCK", backbones)

    def client_model(self, model: nn.Module) -> nn.Module:
        return PersonalAndInteractive(model)

    def setup(self, ctx) -> None:
        super().setup(ctx)
        self.assignment = [None] * ctx.num_clients
        if self.num_clusters > ctx.num_clients:
            ctx.log(f"warning: algorithm.init_args.num_clusters={self.num_clusters} exceeds data.num_clients="
                    f"{ctx.num_clients}: pFedCK uses K = {ctx.num_clients} (one client per cluster); lower "
                    "num_clusters")

    def plan(self, rnd: int) -> list[Step]:
        from cosmos_pl.objectives.mutual import MutualFit
        from cosmos_pl.objectives.protocol import LoadWeights, Upload

        epochs = self.ctx.local_epochs if self.epochs is None else self.epochs
        return [MutualFit(epochs, self.temperature, self.kl_weight, self.feature_weight), Upload("weights"),
                LoadWeights()]

    def server_step(self, rnd: int, uploads: dict[int, dict[str, torch.Tensor]]) -> ServerResult:
        if len(uploads) <= self.num_clusters <= self.ctx.num_clients:  # failed or unsampled clients
            self.ctx.log(f"round {rnd}: pFedCK: {len(uploads)} clients uploaded, not more than num_clusters="
                         f"{self.num_clusters}: each is a cluster of its own this round, so no interactive model is "
                         "averaged with another's")
        keys = list(next(iter(uploads.values())))  # one order for every client, whatever order its dict arrived in
        flat = {i: torch.cat([state[k].flatten().double() for k in keys]) for i, state in uploads.items()}
        found, _ = kmeans(flat, self.num_clusters, self.ctx.stage_seed(rnd, "kmeans", 0), self.n_init)
        self.assignment = [found.get(i) for i in range(self.ctx.num_clients)]
        targets = cluster_means(uploads, found)
        return ServerResult(targets, state_dict_bytes(next(iter(targets.values()))))

    def cluster_of(self, client: int) -> Optional[int]:
        return self.assignment[client]

    def clustering_info(self) -> Optional[dict[str, Any]]:
        return assignment_info(self.assignment, self.num_clusters)

    def state_dict(self) -> dict[str, Any]:
        return {"assignment": list(self.assignment)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.assignment = list(state["assignment"])

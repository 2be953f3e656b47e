"""FedMD: federated model distillation through a consensus on a public set.

Source: D. Li and J. Wang, "FedMD: Heterogenous Federated Learning via Model Distillation", NeurIPS 2019
Workshop on Federated Learning. Each round: every client computes class scores on the public set (communicate),
the server averages them into a consensus (aggregate), every client trains towards the consensus on the public
set (digest), then trains on its own private data for a few epochs (revisit).

Differences from the paper, stated: FedMD first trains every model on a *labelled* public set; cosmos-pl's U is
unlabelled (no algorithm can read U's labels), so there is no public-label pre-training: round 0 (E0 epochs on
D_i) plays its part. The consensus is the mean of the clients' softmax pseudo-labels and the digest minimizes KL
batchmean to it (the paper's variant regresses logits with an L1 loss); both keep FedMD's idea of one global
consensus.

Scored model: the client model f_i.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import torch

from cosmos_pl.algorithms.base import Algorithm, ServerResult, check_setting
from cosmos_pl.communication import pseudo_label_bytes

if TYPE_CHECKING:
    from cosmos_pl.algorithms.base import Step

__all__ = ["FedMD", "consensus_mean"]


def consensus_mean(uploads: dict[int, torch.Tensor]) -> torch.Tensor:
    """FedMD's consensus: the mean over clients of their pseudo-labels, ``{i: [n, M]} -> [n, M]``."""
    return torch.stack([uploads[i] for i in sorted(uploads)]).float().mean(dim=0)


class FedMD(Algorithm):
    """Communicate, aggregate (mean of all clients), digest (KL on U), revisit (CE on D_i).

    Args:
        digest_epochs: epochs over U towards the consensus per round; null uses clients.distill_epochs.
        revisit_epochs: epochs on D_i after the digest per round; null uses clients.local_epochs.
    """

    name = "fedmd"

    def __init__(self, digest_epochs: Optional[int] = None, revisit_epochs: Optional[int] = None) -> None:
        for key, value in (("digest_epochs", digest_epochs), ("revisit_epochs", revisit_epochs)):
            check_setting(key, value, value is None or value >= 0, ">= 0 or null")
        self.digest_epochs, self.revisit_epochs = digest_epochs, revisit_epochs

    def plan(self, rnd: int) -> list[Step]:
        from cosmos_pl.objectives.distill import Distill
        from cosmos_pl.objectives.local_fit import LocalFit
        from cosmos_pl.objectives.protocol import Upload

        digest = self.ctx.distill_epochs if self.digest_epochs is None else self.digest_epochs
        revisit = self.ctx.local_epochs if self.revisit_epochs is None else self.revisit_epochs
        return [Upload("soft"), Distill(digest), LocalFit(revisit)]

    def server_step(self, rnd: int, uploads: dict[int, torch.Tensor]) -> ServerResult:
        consensus = consensus_mean(uploads)
        targets = {i: consensus for i in range(self.ctx.num_clients)}  # every client digests the one consensus
        return ServerResult(targets, pseudo_label_bytes(*consensus.shape))

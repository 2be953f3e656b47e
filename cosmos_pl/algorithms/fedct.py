"""FedCT: federated co-training with hard labels on a public set.

Source: A. Abourayya et al., "Protecting Sensitive Data through Federated Co-Training" (FedCT), 2023. Each round every client predicts hard labels on the
unlabelled public set, the server forms a consensus by a per-sample majority vote, and every client trains on its
own data together with the public set labelled by that consensus.

Tie rule: when several classes get the same number of votes for a sample, the lowest class index wins
(``torch.argmax`` returns the first maximum).

Scored model: the client model f_i.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import torch
import torch.nn.functional as F

from cosmos_pl.algorithms.base import Algorithm, ServerResult, check_setting
from cosmos_pl.communication import hard_label_bytes

if TYPE_CHECKING:
    from cosmos_pl.algorithms.base import Step

__all__ = ["FedCT", "majority_vote"]


def majority_vote(uploads: dict[int, torch.Tensor]) -> torch.Tensor:
    """Per-sample majority vote over clients' hard labels given as one-hot rows ``{i: [n, M]}``.

    Returns the consensus as one-hot rows ``[n, M]``; ties go to the lowest class index.
    """
    votes = torch.stack([uploads[i] for i in sorted(uploads)]).argmax(dim=2)  # [G, n]
    m = next(iter(uploads.values())).shape[1]
    counts = F.one_hot(votes, m).sum(dim=0)  # [n, M]
    return F.one_hot(counts.argmax(dim=1), m).float()


class FedCT(Algorithm):
    """Upload hard labels on U, majority vote, train on D_i together with the consensus-labelled U.

    Args:
        epochs: epochs over D_i and the labelled U per round; null uses clients.local_epochs.
    """

    name = "fedct"

    def __init__(self, epochs: Optional[int] = None) -> None:
        check_setting("epochs", epochs, epochs is None or epochs >= 0, ">= 0 or null")
        self.epochs = epochs

    def plan(self, rnd: int) -> list[Step]:
        from cosmos_pl.objectives.protocol import Upload
        from cosmos_pl.objectives.union import UnionFit

        return [Upload("hard"), UnionFit(self.ctx.local_epochs if self.epochs is None else self.epochs)]

    def server_step(self, rnd: int, uploads: dict[int, torch.Tensor]) -> ServerResult:
        consensus = majority_vote(uploads)
        targets = {i: consensus for i in range(self.ctx.num_clients)}
        return ServerResult(targets, hard_label_bytes(*consensus.shape))

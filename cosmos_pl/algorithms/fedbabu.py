"""FedBABU: federated training of the body with a fixed random head, then fine-tuning per client (homogeneous only).

Source: J. Oh, S. Kim, S.-Y. Yun, "FedBABU: Toward Enhanced Representation for Federated Image Classification",
ICLR 2022, Section 3 and Algorithm 1. The classifier head keeps its (shared) random initialization through federated
training and never travels; clients train the body on their data and the server averages the bodies (FedAvg's
sample-weighted rule, over the body's float tensors only). Each client is scored by the global model fine-tuned on
its own data: the personal model becomes the global body with the fixed head, and the whole of it trains for
``finetune_epochs`` epochs (:class:`~cosmos_pl.objectives.finetune.FineTune`).

A client holds both (:class:`~cosmos_pl.models.personal.PersonalAndGlobal` with ``share_head=False``). A round for a
client taking part: cross-entropy on its copy of the global model (head frozen) for ``clients.local_epochs``
epochs, upload the body, load the averaged body, fine-tune. The first round starts the global copy's body from the
client's round-0 model (every algorithm's round 0 is E0 local epochs from a shared initialization here); its head
stays at the shared initialization.

With ``clients_per_round``, a client not sampled loads the new body but is not fine-tuned that round (it
trains nothing): it is scored by its last fine-tuned model.

Scored model: the fine-tuned personal model. Bytes: the body's float tensors, up and down.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torch import nn

from cosmos_pl.algorithms.base import Algorithm, ServerResult, check_setting
from cosmos_pl.algorithms.fedavg import global_model_receivers, require_one_backbone, weighted_average
from cosmos_pl.communication import state_dict_bytes
from cosmos_pl.models.personal import PersonalAndGlobal

if TYPE_CHECKING:
    from cosmos_pl.algorithms.base import Step

__all__ = ["FedBABU"]


class FedBABU(Algorithm):
    """Body-only averaging with a frozen head, fine-tuning before scoring.

    Args:
        finetune_epochs: epochs of fine-tuning the whole model on D_i each round, >= 0 (0: the global model is
            scored as it is).
    """

    name = "fedbabu"
    shared_init = True
    uses_public = False

    def __init__(self, finetune_epochs: int = 1) -> None:
        check_setting("finetune_epochs", finetune_epochs, finetune_epochs >= 0, ">= 0")
        self.finetune_epochs = finetune_epochs

    def validate(self, backbones: list[str]) -> None:
        require_one_backbone("FedBABU", backbones)

    def client_model(self, model: nn.Module) -> nn.Module:
        return PersonalAndGlobal(model, share_head=False)

    def plan(self, rnd: int) -> list[Step]:
        from cosmos_pl.objectives.finetune import FineTune
        from cosmos_pl.objectives.local_fit import LocalFit
        from cosmos_pl.objectives.protocol import LoadWeights, StartGlobal, Upload

        return [StartGlobal(with_head=False), LocalFit(self.ctx.local_epochs, part="shared"), Upload("weights"),
                LoadWeights(), FineTune(self.finetune_epochs)]

    def weight_receivers(self, served: list[int], sampled: list[int], targets: dict[int, Any]) -> list[int]:
        return global_model_receivers(served, sampled, targets)  # every client holds the global model

    def server_step(self, rnd: int, uploads: dict[int, Any]) -> ServerResult:
        average = weighted_average(uploads, dict(enumerate(self.ctx.client_sizes)))
        return ServerResult({i: average for i in range(self.ctx.num_clients)}, state_dict_bytes(average))

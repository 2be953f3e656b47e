"""Ditto: a personal model per client, pulled toward a global model trained by FedAvg (homogeneous clients only).

Source: T. Li, S. Hu, A. Beirami, V. Smith, "Ditto: Fair and Robust Federated Learning Through Personalization",
ICML 2021, Eq. 2 and Algorithm 1. Each client holds its personal model v_i and a copy of the global model w
(:class:`~cosmos_pl.models.personal.PersonalAndGlobal`). In a round, a client taking part
1. updates v_i on its data D_i with ``F_i(v_i) + lambda / 2 * ||v_i - w^t||^2`` for ``personal_epochs`` epochs,
   w^t being the global model it holds (:class:`~cosmos_pl.objectives.proximal.ProxFit`);
2. trains its copy of w^t with cross-entropy for ``clients.local_epochs`` epochs and sends it;
3. loads w^{t+1}, the server's sample-weighted average of the copies sent (FedAvg's rule).
Both updates start from w^t, as in Algorithm 1. A client's first round starts its copy of the global model from
its round-0 model (every algorithm's round 0 is E0 local epochs from a shared initialization here), so
Ditto's global model follows FedAvg's exactly.

Scored model: the personal model v_i. Bytes: the global model's float tensors, up and down.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Optional

from torch import nn

from cosmos_pl.algorithms.base import Algorithm, ServerResult, check_setting
from cosmos_pl.algorithms.fedavg import global_model_receivers, require_one_backbone, weighted_average
from cosmos_pl.communication import state_dict_bytes
from cosmos_pl.models.personal import PersonalAndGlobal

if TYPE_CHECKING:
    from cosmos_pl.algorithms.base import Step

__all__ = ["Ditto"]


class Ditto(Algorithm):
    """Personal models with a proximal pull to a FedAvg global model.

    Args:
        lambda_: lambda >= 0, the weight of ``||v_i - w||^2 / 2`` (0: the personal models train alone; the paper
            picks it from {0.01, 0.1, 1, 2}).
        personal_epochs: epochs of the personal update per round; null uses ``clients.local_epochs``.
    """

    name = "ditto"
    shared_init = True
    uses_public = False

    def __init__(self, lambda_: float = 0.1, personal_epochs: Optional[int] = None) -> None:
        check_setting("lambda_", lambda_, math.isfinite(lambda_) and lambda_ >= 0, "finite and >= 0")
        check_setting("personal_epochs", personal_epochs, personal_epochs is None or personal_epochs >= 0,
                      ">= 0 or null")
        self.lambda_, self.personal_epochs = lambda_, personal_epochs

    def validate(self, backbones: list[str]) -> None:
        require_one_backbone("Ditto", backbones)

    def client_model(self, model: nn.Module) -> nn.Module:
        return PersonalAndGlobal(model)

    def plan(self, rnd: int) -> list[Step]:
        from cosmos_pl.objectives.local_fit import LocalFit
        from cosmos_pl.objectives.protocol import LoadWeights, StartGlobal, Upload
        from cosmos_pl.objectives.proximal import ProxFit

        personal = self.ctx.local_epochs if self.personal_epochs is None else self.personal_epochs
        return [StartGlobal(), ProxFit(personal, self.lambda_), LocalFit(self.ctx.local_epochs, part="shared"),
                Upload("weights"), LoadWeights()]

    def weight_receivers(self, served: list[int], sampled: list[int], targets: dict[int, Any]) -> list[int]:
        return global_model_receivers(served, sampled, targets)  # every client holds the global model

    def server_step(self, rnd: int, uploads: dict[int, Any]) -> ServerResult:
        average = weighted_average(uploads, dict(enumerate(self.ctx.client_sizes)))
        return ServerResult({i: average for i in range(self.ctx.num_clients)}, state_dict_bytes(average))

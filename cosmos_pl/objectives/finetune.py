"""FedBABU's personalization: the personal model becomes the global one, then all of it trains with cross-entropy.

Source: J. Oh, S. Kim, S.-Y. Yun, "FedBABU: Toward Enhanced Representation for Federated Image Classification",
ICLR 2022, Section 3. The step :class:`FineTune` and its stage :func:`fine_tune` (local training's
:func:`~cosmos_pl.objectives.local_fit.fit_supervised` on the personal model).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Optional

import torch
from torch import nn

from cosmos_pl.objectives.local_fit import fit_supervised
from cosmos_pl.objectives.step import ClientStep, StepSettings, Task

if TYPE_CHECKING:
    from cosmos_pl.training.client import Client

__all__ = ["FineTune", "fine_tune"]


def fine_tune(model: nn.Module, x: torch.Tensor, y: torch.Tensor, **kwargs: Any) -> list[dict[str, float]]:
    """``model.personal`` becomes a copy of ``model.shared`` (the global body with its fixed head), then the whole
    of it is trained with cross-entropy (:func:`~cosmos_pl.objectives.local_fit.fit_supervised`'s arguments,
    ``part`` aside). ``model`` is a :class:`~cosmos_pl.models.personal.PersonalAndGlobal`. Returns one dict per
    epoch."""
    model.personal.load_state_dict(model.shared.state_dict())
    return fit_supervised(model, x, y, part="personal", **kwargs)


@dataclass(frozen=True)
class FineTune(ClientStep):
    """FedBABU's personalization: the personal model becomes the global one the client holds, then the whole of it
    trains with cross-entropy on D_i for ``epochs`` epochs (``clients.optimizer``; :func:`fine_tune`). No target."""

    epochs: int
    stage: ClassVar[str] = "fine-tuning"
    needs_target: ClassVar[bool] = False
    seed_stage: ClassVar[str] = "finetune"
    stage_id: ClassVar[int] = 9

    def idle(self) -> bool:
        return False  # with 0 epochs it still makes the personal model the global one

    def task(self, runtime: StepSettings, client: "Client", rnd: int, target: Optional[torch.Tensor]) -> Task:
        return fine_tune, dict(self.stage_arguments(runtime, client, rnd), x=client.data.x, y=client.data.y,
                               epochs=self.epochs)

"""Local training: cross-entropy on a client's own labelled data D_i (COSMOS paper, Section 4.1 Step 1 and 4.2
Step 1; every algorithm's round 0, COSMOS's IFFT local fine-tune, local-only, FedMD's revisit, COMET's sequential
local step, FedAvg's local update, Ditto's and FedBABU's global update).

The step :class:`LocalFit`, its LightningModule :class:`SupervisedModule` and its stage :func:`fit_supervised`
(also the stage of FedCT's co-training and FedBABU's fine-tuning).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Optional

import torch
import torch.nn.functional as F
from torch import nn

from cosmos_pl.models.personal import PersonalAndGlobal
from cosmos_pl.objectives.stage import run_stage
from cosmos_pl.objectives.step import ClientStep, StepSettings, Task
from cosmos_pl.training.module import CosmosModule

if TYPE_CHECKING:
    from cosmos_pl.training.client import Client

__all__ = ["LocalFit", "SupervisedModule", "fit_supervised"]


class SupervisedModule(CosmosModule):
    """Cross-entropy on batches ``(x uint8 [B, C, H, W], y int64 [B])``, inputs randomly transformed by T."""

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        logits = self.backbone(self.prepare(x, transform=True))
        loss = F.cross_entropy(logits.float(), y)
        self._track(loss)
        return loss


def fit_supervised(model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, part: str = "",
                   **stage: Any) -> list[dict[str, float]]:
    """Train ``model`` in place with cross-entropy on ``x`` uint8 ``[n, C, H, W]``, ``y`` int64 ``[n]``
    (:class:`SupervisedModule`, shuffled batches; ``stage``: :func:`~cosmos_pl.objectives.stage.run_stage`'s
    settings: epochs, batch size, optimizer, transformations, trainer, seed, where, optimizer key).

    ``part``: the dotted name of the submodule trained (``""``: the whole model; ``"shared"``: a
    :class:`~cosmos_pl.models.personal.PersonalAndGlobal`'s copy of the global model); parameters with
    ``requires_grad=False`` stay fixed. Returns one dict per epoch with the mean training ``loss``.

    Raises:
        DivergenceError: a step's loss, or the weights after training, are non-finite.
    """
    return run_stage(model, SupervisedModule, (x, y), part=part, **stage)


@dataclass(frozen=True)
class LocalFit(ClientStep):
    """Cross-entropy on the client's own labelled data D_i for ``epochs`` epochs (``clients.optimizer``).

    ``part``: the submodule trained: ``""`` the model the client predicts with (the whole model; the personal model
    of a :class:`~cosmos_pl.models.personal.PersonalAndGlobal`, as round 0 trains it, so that its copy of the global
    model stays at the shared initialization), ``"shared"`` that copy (Ditto's and FedBABU's global update).
    """

    epochs: int
    part: str = ""
    stage: ClassVar[str] = "local training"
    needs_target: ClassVar[bool] = False
    seed_stage: ClassVar[str] = "local"
    stage_id: ClassVar[int] = 1

    def task(self, runtime: StepSettings, client: "Client", rnd: int, target: Optional[torch.Tensor]) -> Task:
        part = self.part or ("personal" if isinstance(client.model, PersonalAndGlobal) else "")
        extra = {"part": part} if part else {}
        return fit_supervised, dict(self.stage_arguments(runtime, client, rnd), x=client.data.x, y=client.data.y,
                                    epochs=self.epochs, **extra)

"""The protocol steps of a round, which train nothing: what a client sends (:class:`Upload`), the server's averaged
weights loaded (:class:`LoadWeights`), and a personalized client's first copy of the global model
(:class:`StartGlobal`, Ditto and FedBABU). The round loop handles :class:`Upload` and :class:`LoadWeights` itself;
:class:`StartGlobal` runs on the client like a training step. No Lightning here."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Literal, Optional

import torch
from torch import nn

from cosmos_pl.objectives.step import ClientStep, StepSettings, Task

if TYPE_CHECKING:
    from cosmos_pl.training.client import Client

__all__ = ["LoadWeights", "StartGlobal", "Upload", "start_global"]


@dataclass(frozen=True)
class Upload:
    """What each client sends to the server.

    ``kind``: ``"soft"`` pseudo-labels on U ``[n, M]`` (encoded per ``communication``), ``"hard"`` class indices
    on U ``[n]`` (1 byte each for M <= 256, else 2; the server sees them as one-hot rows), or ``"weights"``
    (the float tensors of the model's state dict; of a :class:`~cosmos_pl.models.personal.PersonalAndGlobal`, its
    copy of the global model, without the head when it is not shared:
    :func:`~cosmos_pl.models.personal.shared_weights`).
    """

    kind: Literal["soft", "hard", "weights"] = "soft"


@dataclass(frozen=True)
class LoadWeights:
    """Load the server's averaged weights into the client's model (FedAvg; into the copy of the global model for
    Ditto and FedBABU); the target is a state dict, keyed as :func:`~cosmos_pl.models.personal.shared_weights`."""


def start_global(model: nn.Module, with_head: bool) -> list[dict[str, float]]:
    """The global model's first local copy is the client's round-0 model: unless ``model.shared`` already holds a
    global model (``model.global_started``), it takes ``model.personal``'s weights (all of them, or the body alone
    when ``with_head`` is False: FedBABU's head stays at its shared initialization). ``model`` is a
    :class:`~cosmos_pl.models.personal.PersonalAndGlobal`; no training, so no losses."""
    if int(model.global_started) == 0:
        state = {k: v for k, v in model.personal.state_dict().items() if with_head or not model.is_head(k)}
        model.shared.load_state_dict(state, strict=False)
        model.global_started.fill_(1)
    return []


@dataclass(frozen=True)
class StartGlobal(ClientStep):
    """Unless it holds a global model already, the client's copy of the global model takes its round-0 model's
    weights (the body alone when ``with_head`` is False), so the first average starts where FedAvg's does
    (:func:`start_global`). In every round's plan: a client that failed its first round, or takes part first later,
    is covered."""

    with_head: bool = True
    stage: ClassVar[str] = "global start"
    needs_target: ClassVar[bool] = False

    def task(self, runtime: StepSettings, client: "Client", rnd: int, target: Optional[torch.Tensor]) -> Task:
        return start_global, dict(model=client.model, with_head=self.with_head)

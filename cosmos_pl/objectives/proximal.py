"""Ditto's personal update: cross-entropy plus a proximal pull toward the global model the client holds.

Source: T. Li, S. Hu, A. Beirami, V. Smith, "Ditto: Fair and Robust Federated Learning Through Personalization",
ICML 2021, Eq. 2 and Algorithm 1. The step :class:`ProxFit`, its loss :func:`proximal_term`, its LightningModule
:class:`ProximalModule` and its stage :func:`fit_proximal`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Optional

import torch
import torch.nn.functional as F
from torch import nn

from cosmos_pl.objectives.stage import run_stage
from cosmos_pl.objectives.step import ClientStep, StepSettings, Task
from cosmos_pl.training.module import LARGE_LAMBDA, CosmosModule

if TYPE_CHECKING:
    from cosmos_pl.training.client import Client

__all__ = ["ProxFit", "ProximalModule", "fit_proximal", "proximal_term"]


def proximal_term(parameters: list[torch.Tensor], anchor: list[torch.Tensor], lam: float) -> torch.Tensor:
    """``lam / 2 * ||v - w||^2``: ``parameters`` v and ``anchor`` w, one tensor per parameter, summed over all."""
    distance = sum(((p.float() - a.float()) ** 2).sum() for p, a in zip(parameters, anchor))
    return 0.5 * lam * distance


class ProximalModule(CosmosModule):
    """Cross-entropy plus Ditto's proximal term: ``F_i(v) + lam / 2 * ||v - w||^2`` over the backbone's parameters
    v and a fixed ``anchor`` w (the global model), so each step moves v by ``-lr * (grad F_i(v) + lam (v - w))``.
    Batches ``(x uint8 [B, C, H, W], y int64 [B])``, inputs randomly transformed by T. The logged parts are ``ce``
    and ``prox`` (``lam / 2 * ||v - w||^2``). The backbone and the other arguments are :class:`CosmosModule`'s.

    Args:
        anchor: w, one tensor per parameter of ``backbone`` in ``backbone.parameters()`` order (kept as buffers,
            so they follow the module to its device).
        lam: lambda >= 0 (0: plain cross-entropy).

    Raises:
        ValueError: the anchor does not have one tensor per parameter, of the same shapes.
    """

    def __init__(self, backbone: nn.Module, *args: Any, anchor: list[torch.Tensor], lam: float, **kwargs: Any) -> None:
        super().__init__(backbone, *args, **kwargs)
        params = list(self.backbone.parameters())
        if len(anchor) != len(params) or any(a.shape != p.shape for a, p in zip(anchor, params)):
            raise ValueError("ProximalModule: the anchor must have one tensor per parameter, of the same shapes")
        self.lam = lam
        for j, a in enumerate(anchor):
            self.register_buffer(f"anchor_{j}", a.detach().clone(), persistent=False)

    def _more_fixes(self) -> str:
        return f", or lambda, the weight of the proximal term (now {self.lam:g})" if not self.lam <= LARGE_LAMBDA \
            else ""

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        ce = F.cross_entropy(self.backbone(self.prepare(x, transform=True)).float(), y)
        params = list(self.backbone.parameters())
        prox = proximal_term(params, [getattr(self, f"anchor_{j}") for j in range(len(params))], self.lam)
        loss = ce + prox
        self._track(loss, ce=ce, prox=prox)
        return loss


def fit_proximal(model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, lam: float,
                 **stage: Any) -> list[dict[str, float]]:
    """Ditto's personal update (Algorithm 1): train ``model.personal`` (v_i) in place on ``x`` uint8
    ``[n, C, H, W]``, ``y`` int64 ``[n]`` with cross-entropy plus ``lam / 2 * ||v_i - w||^2``, w being
    ``model.shared`` (the client's copy of the global model) as the stage starts, held fixed
    (:class:`ProximalModule`; ``stage``: :func:`~cosmos_pl.objectives.stage.run_stage`'s settings). ``model`` is a
    :class:`~cosmos_pl.models.personal.PersonalAndGlobal`. Returns one dict per epoch (``loss``, ``ce``, ``prox``).

    Raises:
        DivergenceError: a step's loss, or the weights after training, are non-finite.
    """
    anchor = [p.detach() for p in model.shared.parameters()]
    return run_stage(model, ProximalModule, (x, y), part="personal", anchor=anchor, lam=lam, **stage)


@dataclass(frozen=True)
class ProxFit(ClientStep):
    """Ditto's personal update: cross-entropy on D_i plus ``lam / 2 * ||v_i - w||^2`` for ``epochs`` epochs
    (``clients.optimizer``), v_i the client's personal model and w its copy of the global model as it holds it
    (:func:`fit_proximal`). No target: w is already on the client."""

    epochs: int
    lam: float
    stage: ClassVar[str] = "personal training"
    needs_target: ClassVar[bool] = False
    seed_stage: ClassVar[str] = "prox"
    stage_id: ClassVar[int] = 8

    def task(self, runtime: StepSettings, client: "Client", rnd: int, target: Optional[torch.Tensor]) -> Task:
        return fit_proximal, dict(self.stage_arguments(runtime, client, rnd), x=client.data.x, y=client.data.y,
                                  epochs=self.epochs, lam=self.lam)

"""pFedCK's client objective: the personalized and the interactive model distil into each other on D_i.

Source: J. Zhang, Y. Shi, "A Personalized Federated Learning Method Based on Clustering and Knowledge
Distillation", Electronics (MDPI) 2024: both models "perform knowledge distillation with each other through the
feature representation of the middle layer and the soft prediction of the model". The loss of each model, the other
held fixed (its outputs detached, so it gets no gradient from this loss), is the COSMOS authors' (``Client_pFedCK``)::

    L_phi   = CE(z_phi, y)   + a * T^2 * KL(softmax(z_omega / T) || softmax(z_phi / T))   + b * MSE(h_phi, h_omega)
    L_omega = CE(z_omega, y) + a * T^2 * KL(softmax(z_phi / T)   || softmax(z_omega / T)) + b * MSE(h_omega, h_phi)

z: logits ``[B, M]``; h: pre-logits features ``[B, D]`` (:func:`~cosmos_pl.models.features.features_and_logits`);
KL summed over classes and averaged over the batch; MSE averaged over the ``B * D`` entries.

Both losses are taken in one step on one optimizer (``clients.optimizer``) over both models: each loss reaches only
its own model's parameters, so this is the simultaneous form of the reference's per-batch alternation (there, omega
steps against phi after phi's step of the same batch). The simultaneous form costs two forward passes per batch
instead of three, keeps Lightning's automatic optimization (gradient clipping and precision as for every stage), and
with a per-parameter optimizer (Adam, SGD) each model takes the step it would take alone on its own loss.

The step :class:`MutualFit`, its losses :func:`distillation_loss` and :func:`mutual_losses`, its LightningModule
:class:`MutualModule` and its stage :func:`fit_mutual`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Optional

import torch
import torch.nn.functional as F
from torch import nn

from cosmos_pl.models.features import features_and_logits
from cosmos_pl.objectives.stage import run_stage
from cosmos_pl.objectives.step import ClientStep, StepSettings, Task
from cosmos_pl.training.module import LARGE_LAMBDA, CosmosModule

if TYPE_CHECKING:
    from cosmos_pl.training.client import Client

__all__ = ["MutualFit", "MutualModule", "distillation_loss", "fit_mutual", "mutual_losses"]


def distillation_loss(logits: torch.Tensor, features: torch.Tensor, teacher_logits: torch.Tensor,
                      teacher_features: torch.Tensor, y: torch.Tensor, *, temperature: float, kl_weight: float,
                      feature_weight: float) -> torch.Tensor:
    """``CE(z, y) + a * T^2 * KL(softmax(z_t / T) || softmax(z / T)) + b * MSE(h, h_t)``, the teacher's outputs
    detached (no gradient reaches the teacher).

    Args:
        logits: z, the student's logits ``[B, M]``.
        features: h, the student's pre-logits features ``[B, D]``.
        teacher_logits: z_t ``[B, M]``.
        teacher_features: h_t ``[B, D]``.
        y: labels, int64 ``[B]``.
        temperature: T > 0.
        kl_weight: a >= 0.
        feature_weight: b >= 0.

    Returns:
        The scalar loss (KL summed over classes and averaged over the batch; MSE averaged over all entries).
    """
    t = temperature
    ce = F.cross_entropy(logits.float(), y)
    kl = F.kl_div(torch.log_softmax(logits.float() / t, dim=1), torch.log_softmax(teacher_logits.detach().float() / t,
                  dim=1), reduction="batchmean", log_target=True)
    mse = F.mse_loss(features.float(), teacher_features.detach().float())
    return ce + kl_weight * t * t * kl + feature_weight * mse


def mutual_losses(personal: tuple[torch.Tensor, torch.Tensor], interactive: tuple[torch.Tensor, torch.Tensor],
                  y: torch.Tensor, **weights: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(L_phi, L_omega)``: each model's :func:`distillation_loss` with the other as its teacher.

    Args:
        personal: phi's ``(features [B, D], logits [B, M])``.
        interactive: omega's ``(features [B, D], logits [B, M])``.
        y: labels, int64 ``[B]``.
        weights: ``temperature``, ``kl_weight``, ``feature_weight`` (:func:`distillation_loss`).
    """
    (h_phi, z_phi), (h_omega, z_omega) = personal, interactive
    return (distillation_loss(z_phi, h_phi, z_omega, h_omega, y, **weights),
            distillation_loss(z_omega, h_omega, z_phi, h_phi, y, **weights))


class MutualModule(CosmosModule):
    """``L_phi + L_omega`` per step (:func:`mutual_losses`) over a
    :class:`~cosmos_pl.models.interactive.PersonalAndInteractive` backbone, both models fed the same transformed
    batch ``(x uint8 [B, C, H, W], y int64 [B])``. The logged parts are ``personal`` (L_phi) and ``interactive``
    (L_omega). The backbone and the other arguments are :class:`CosmosModule`'s.

    Args:
        temperature: T > 0.
        kl_weight: a >= 0.
        feature_weight: b >= 0.
    """

    def __init__(self, backbone: nn.Module, *args: Any, temperature: float, kl_weight: float, feature_weight: float,
                 **kwargs: Any) -> None:
        super().__init__(backbone, *args, **kwargs)
        self.weights = {"temperature": temperature, "kl_weight": kl_weight, "feature_weight": feature_weight}

    def _more_fixes(self) -> str:
        big = [f"{k} (now {v:g})" for k, v in self.weights.items() if k != "temperature" and not v <= LARGE_LAMBDA]
        return f", or {' and '.join(big)}" if big else ""

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        inputs = self.prepare(x, transform=True)
        personal = features_and_logits(self.backbone.personal, inputs)
        interactive = features_and_logits(self.backbone.shared, inputs)
        l_phi, l_omega = mutual_losses(personal, interactive, y, **self.weights)
        loss = l_phi + l_omega
        self._track(loss, personal=l_phi, interactive=l_omega)
        return loss


def fit_mutual(model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, temperature: float, kl_weight: float,
               feature_weight: float, **stage: Any) -> list[dict[str, float]]:
    """pFedCK's local update: train ``model.personal`` (phi) and ``model.shared`` (omega) of a
    :class:`~cosmos_pl.models.interactive.PersonalAndInteractive` in place on ``x`` uint8 ``[n, C, H, W]``, ``y``
    int64 ``[n]`` by mutual distillation (:class:`MutualModule`; ``stage``:
    :func:`~cosmos_pl.objectives.stage.run_stage`'s settings). Returns one dict per epoch (``loss``, ``personal``,
    ``interactive``).

    Raises:
        DivergenceError: a step's loss, or the weights after training, are non-finite.
    """
    return run_stage(model, MutualModule, (x, y), temperature=temperature, kl_weight=kl_weight,
                     feature_weight=feature_weight, **stage)


@dataclass(frozen=True)
class MutualFit(ClientStep):
    """pFedCK's client update: ``epochs`` epochs of mutual distillation between the personalized model and the
    interactive model on D_i (``clients.optimizer``; :func:`fit_mutual`). No target: both models are on the
    client."""

    epochs: int
    temperature: float = 2.0
    kl_weight: float = 0.5
    feature_weight: float = 0.5
    stage: ClassVar[str] = "mutual distillation"
    needs_target: ClassVar[bool] = False
    seed_stage: ClassVar[str] = "mutual"
    stage_id: ClassVar[int] = 10

    def task(self, runtime: StepSettings, client: "Client", rnd: int, target: Optional[torch.Tensor]) -> Task:
        return fit_mutual, dict(self.stage_arguments(runtime, client, rnd), x=client.data.x, y=client.data.y,
                                epochs=self.epochs, temperature=self.temperature, kl_weight=self.kl_weight,
                                feature_weight=self.feature_weight)

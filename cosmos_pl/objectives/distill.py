"""Distillation to soft pseudo-labels with the consistency regularizer r_B (COSMOS paper, Eq. 1 and Eq. 2).

A client distills its cluster teacher's pseudo-labels on U (Eq. 2; FedMD's digest and COMET's sequential mode with
lambda 0), and a cluster teacher distills its clients' mean pseudo-label (Eq. 1,
:func:`cosmos_pl.algorithms.cosmos.teacher_stage`). Here: the loss :func:`distillation_loss`, the LightningModule
:class:`DistillationModule`, the stage :func:`fit_distillation` and the client step :class:`Distill`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Optional

import torch
from torch import nn

from cosmos_pl.losses import adjust_to_prior, kl_per_sample
from cosmos_pl.objectives.stage import run_stage
from cosmos_pl.objectives.step import ClientStep, StepSettings, Task
from cosmos_pl.training.module import LARGE_LAMBDA, CosmosModule, OptimizerFactory
from cosmos_pl.transforms import Transformations

if TYPE_CHECKING:
    from cosmos_pl.training.client import Client

__all__ = ["Distill", "DistillationModule", "distillation_loss", "fit_distillation"]


def distillation_loss(
    logits: torch.Tensor,
    targets: torch.Tensor,
    view_logits: torch.Tensor | None = None,
    lam: float = 0.0,
    weights: torch.Tensor | None = None,
    *,
    target_grad: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Eq. 1 (server) / Eq. 2 (client) of the COSMOS paper, for one batch.

    ``loss = (1/B) sum_x w(x) [ KL(target(x) || g(x)) + lam * r_B(g)(x) ]`` with
    ``r_B(g)(x) = sum_{x' in S} KL(g(x) || g(x'))`` (the paper's l(g(x'), g(x)) with l = KL to the target g(x)).
    Reduction is "batchmean" as in the paper (Appendix C, ``nn.KLDivLoss(reduction='batchmean')``): the weighted
    sum over the batch divided by B. r_B always sends gradient through the views g(x') (a regularizer computed
    without gradient would add nothing to training). By default the clean prediction g(x) is its target, held fixed
    (stop-gradient) as the second argument of l is in the KL term; ``target_grad=True`` lets gradient flow into
    g(x) too. On Fashion-MNIST a from-scratch teacher with lambda 5 reached the 4-client ensemble's accuracy with
    the fixed target and fell 4 points below it with gradient on both sides (the target drifts toward the views).

    Args:
        logits: ``[B, M]`` model logits on the clean inputs x.
        targets: ``[B, M]`` soft pseudo-labels (rows on the simplex).
        view_logits: ``[S, B, M]`` or ``[B, M]`` logits on views x' in B(x); None skips r_B.
        lam: lambda >= 0, the weight of r_B.
        weights: ``[B]`` per-sample weights w_i(x) (default all ones).
        target_grad: also back-propagate r_B through the clean prediction g(x) (default False).

    Returns:
        (total, kl, r_B): scalars, the last two already weighted and batch-averaged (total = kl + lam * r_B).
    """
    b = logits.shape[0]
    w = torch.ones(b, device=logits.device, dtype=torch.float32) if weights is None else weights.float()
    log_q = torch.log_softmax(logits.float(), dim=1)
    kl = (w * kl_per_sample(log_q, targets.float())).sum() / b
    if view_logits is None or lam == 0:
        reg = torch.zeros((), device=logits.device)
    else:
        views = view_logits.float()
        if views.dim() == 2:
            views = views[None]
        p_clean = log_q.exp() if target_grad else log_q.exp().detach()
        per_view = torch.stack([kl_per_sample(torch.log_softmax(v, dim=1), p_clean) for v in views])  # [S, B]
        reg = (w * per_view.sum(dim=0)).sum() / b
    return kl + lam * reg, kl, reg


class DistillationModule(CosmosModule):
    """KL(batchmean) to pseudo-labels plus ``lam * r_B`` over ``num_views`` perturbed views x' in B(x).

    Batches are ``(x uint8 [B, C, H, W], targets float [B, M], weights float [B])``; the clean x and its
    views go through the backbone in one forward pass. Used for a cluster teacher (Eq. 1, weights 1) and
    for a client (Eq. 2, weights w_i(x)).

    Args:
        backbone: maps float ``[B, C, H, W]`` to logits ``[B, M]``.
        optimizer: the optimizer factory (default in configs: Adam lr 1e-4).
        transformations: T and d that define the views x'; required when ``lam > 0``.
        lam: lambda >= 0, the weight of r_B (paper default 5).
        num_views: |S|, views sampled from the neighbourhood per sample and step.
        channels_last: run the backbone in channels-last memory format.
        target_grad: let r_B's gradient also flow into the clean prediction g(x) (see :func:`distillation_loss`).
        augment: feed the KL term a random T(x) instead of the clean x (the same point anchors r_B); T(x) lies
            in the transformation ball B(x), so Eq. 1/2 keep their form while the labelled branch sees the
            augmented inputs supervised training sees.
        freeze_bn: keep BatchNorm layers in evaluation mode (running statistics neither used from the batch
            nor updated), so distilling on U does not replace statistics learned on the model's own data.
        where: names the stage in error messages (see :class:`CosmosModule`).
        optimizer_key: names the optimizer setting in error messages (see :class:`CosmosModule`).

    Raises:
        ValueError: lam < 0, num_views < 1, or lam > 0 without transformations.
        DivergenceError: a training step's loss is non-finite.
    """

    def __init__(
        self,
        backbone: nn.Module,
        optimizer: OptimizerFactory,
        transformations: Transformations | None = None,
        lam: float = 5.0,
        num_views: int = 1,
        *,
        channels_last: bool = False,
        target_grad: bool = False,
        augment: bool = False,
        freeze_bn: bool = False,
        where: str = "training",
        optimizer_key: str = "",
    ) -> None:
        if lam < 0:
            raise ValueError(f"lambda_={lam}: the weight of r_B must be >= 0")
        if num_views < 1:
            raise ValueError(f"num_views={num_views}: at least one view x' is needed")
        if lam > 0 and transformations is None:
            raise ValueError("lambda_ > 0 needs transformations to draw views x' in B(x); set lambda_: 0 or give transformations")
        super().__init__(backbone, optimizer, transformations, channels_last=channels_last, where=where,
                         optimizer_key=optimizer_key)
        self.lam = lam
        self.num_views = num_views
        self.target_grad = target_grad
        self.augment = augment
        self.freeze_bn = freeze_bn

    def _more_fixes(self) -> str:
        return f", or lambda, the weight of r_B (now {self.lam:g})" if not self.lam <= LARGE_LAMBDA else ""  # NaN too

    def on_train_epoch_start(self) -> None:
        if self.freeze_bn:  # Lightning puts the model in train mode before each epoch
            for m in self.backbone.modules():
                if isinstance(m, nn.modules.batchnorm._BatchNorm):
                    m.eval()

    def on_train_end(self) -> None:
        if self.freeze_bn:  # hand the model back wholly in train mode, as the other stages do
            self.backbone.train()

    def training_step(self, batch: tuple[torch.Tensor, ...], batch_idx: int) -> torch.Tensor:
        x, targets, weights = batch
        b = x.shape[0]
        inputs = [self.prepare(x, transform=self.augment)]
        if self.lam > 0:
            inputs += [self.prepare(x, perturb=True) for _ in range(self.num_views)]
        logits = self.backbone(torch.cat(inputs))
        clean = logits[:b]
        views = logits[b:].reshape(self.num_views, b, -1) if self.lam > 0 else None
        loss, kl, reg = distillation_loss(clean, targets, views, self.lam, weights, target_grad=self.target_grad)
        self._track(loss, kl=kl, r_b=reg)
        return loss


def fit_distillation(model: nn.Module, x: torch.Tensor, targets: torch.Tensor, *, lam: float, num_views: int,
                     weights: torch.Tensor | None = None, target_grad: bool = False, augment: bool = False,
                     freeze_bn: bool = False, **stage: Any) -> list[dict[str, float]]:
    """Train ``model`` in place on U: ``x`` uint8 ``[n, C, H, W]``, soft ``targets`` ``[n, M]``, Eq. 1/2
    (:class:`DistillationModule`, shuffled batches; ``stage``: :func:`~cosmos_pl.objectives.stage.run_stage`'s
    settings: epochs, batch size, optimizer, transformations, trainer, seed, where, optimizer key).

    ``weights`` ``[n]`` are the per-sample w_i(x) of Eq. 2 (default all ones); ``target_grad``, ``augment`` and
    ``freeze_bn`` are :class:`DistillationModule`'s switches. Returns one dict per epoch with the mean ``loss`` and
    its parts ``kl`` and ``r_b`` (already weighted, before lambda).

    Raises:
        DivergenceError: non-finite targets, a non-finite step loss, or non-finite weights after training.
    """
    w = torch.ones(len(x)) if weights is None else weights.float()
    return run_stage(model, DistillationModule, (x, targets.float(), w), targets=targets, lam=lam,
                     num_views=num_views, target_grad=target_grad, augment=augment, freeze_bn=freeze_bn, **stage)


@dataclass(frozen=True)
class Distill(ClientStep):
    """Distillation on U to the client's target ``[n, M]``: KL batchmean + ``lam`` * r_B (COSMOS Eq. 2).

    ``lam = 0`` is plain KL distillation (FedMD's digest). Uses ``clients.distill_optimizer``. ``augment`` and
    ``freeze_bn``: see :class:`DistillationModule`. ``prior_correction``: each client first shifts its target to its
    own label prior (:func:`cosmos_pl.losses.adjust_to_prior`); nothing extra is sent.
    """

    epochs: int
    lam: float = 0.0
    num_views: int = 1
    target_grad: bool = False
    augment: bool = False
    freeze_bn: bool = False
    prior_correction: bool = False
    stage: ClassVar[str] = "client distillation"
    seed_stage: ClassVar[str] = "distill"
    stage_id: ClassVar[int] = 3
    optimizer_setting: ClassVar[str] = "distill_optimizer"

    def task(self, runtime: StepSettings, client: "Client", rnd: int, target: Optional[torch.Tensor]) -> Task:
        if self.prior_correction:
            target = adjust_to_prior(target, torch.bincount(client.data.y, minlength=runtime.num_classes))
        return fit_distillation, dict(
            self.stage_arguments(runtime, client, rnd), x=runtime.public, targets=target, epochs=self.epochs,
            lam=self.lam, num_views=self.num_views, target_grad=self.target_grad, augment=self.augment,
            freeze_bn=self.freeze_bn)

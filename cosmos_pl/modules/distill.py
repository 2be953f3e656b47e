"""Distillation to soft pseudo-labels with the consistency regularizer r_B (COSMOS paper, Eq. 1 and Eq. 2)."""

from __future__ import annotations

import torch
from torch import nn

from cosmos_pl.losses import distillation_loss
from cosmos_pl.modules.base import LARGE_LAMBDA, CosmosModule, OptimizerFactory
from cosmos_pl.transforms import Transformations


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
        target_grad: let r_B's gradient also flow into the clean prediction g(x) (see ``distillation_loss``).
        augment: feed the KL term a random T(x) instead of the clean x (the same point anchors r_B); T(x) lies
            in the transformation ball B(x), so Eq. 1/2 keep their form while the labelled branch sees the
            augmented inputs supervised training sees.
        freeze_bn: keep BatchNorm layers in evaluation mode (running statistics neither used from the batch
            nor updated), so distilling on U does not replace statistics learned on the model's own data.
        where, optimizer_key: name the stage and the optimizer setting in error messages (see :class:`CosmosModule`).

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
        super().__init__(backbone, optimizer, transformations, channels_last, where, optimizer_key)
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
        loss, kl, reg = distillation_loss(clean, targets, views, self.lam, weights, self.target_grad)
        self._track(loss, kl=kl, r_b=reg)
        return loss

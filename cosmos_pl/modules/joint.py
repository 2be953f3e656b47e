"""Cross-entropy on local data plus distillation to soft targets on U in every step (COMET's client objective)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from cosmos_pl.losses import kl_per_sample
from cosmos_pl.modules.base import LARGE_LAMBDA, CosmosModule, OptimizerFactory
from cosmos_pl.transforms import Transformations


class JointModule(CosmosModule):
    """``CE(f(T(x)), y) + lam * (1/B_u) sum_u KL(t(u) || f(u))`` per step.

    Batches are ``(x uint8 [B, C, H, W], y int64 [B], u uint8 [B_u, C, H, W], t float [B_u, M])``: a batch of
    the client's labelled data D_i (randomly transformed by T) and a batch of the public set U with its
    targets (clean, as in the KL term of Eq. 2). Both go through the backbone in one forward pass.
    Source: Cho et al., "Communication-Efficient and Model-Heterogeneous Personalized Federated Learning
    via Clustered Knowledge Transfer" (COMET), IEEE JSTSP 2023, the client's local objective.

    ``where`` and ``optimizer_key`` name the stage and the optimizer setting in error messages (see
    :class:`CosmosModule`).

    Raises:
        ValueError: lam < 0.
        DivergenceError: a training step's loss is non-finite.
    """

    def __init__(self, backbone: nn.Module, optimizer: OptimizerFactory, transformations: Transformations | None = None,
                 lam: float = 1.0, channels_last: bool = False, where: str = "training",
                 optimizer_key: str = "") -> None:
        if lam < 0:
            raise ValueError(f"lambda_={lam}: the weight of the distillation term must be >= 0")
        super().__init__(backbone, optimizer, transformations, channels_last, where, optimizer_key)
        self.lam = lam

    def _more_fixes(self) -> str:
        return f", or lambda, the weight of the distillation term (now {self.lam:g})" if not self.lam <= LARGE_LAMBDA \
            else ""

    def training_step(self, batch: tuple[torch.Tensor, ...], batch_idx: int) -> torch.Tensor:
        x, y, u, t = batch
        b = x.shape[0]
        logits = self.backbone(torch.cat([self.prepare(x, transform=True), self.prepare(u)]))
        ce = F.cross_entropy(logits[:b].float(), y)
        kl = kl_per_sample(torch.log_softmax(logits[b:].float(), dim=1), t.float()).mean()
        loss = ce + self.lam * kl
        self._track(loss, ce=ce, kl=kl)
        return loss

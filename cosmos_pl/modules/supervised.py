"""Supervised cross-entropy on a client's labelled local data (COSMOS paper, Section 4.1 Step 1 and 4.2 Step 1)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from cosmos_pl.modules.base import LARGE_LAMBDA, CosmosModule


class SupervisedModule(CosmosModule):
    """Cross-entropy on batches ``(x uint8 [B, C, H, W], y int64 [B])``, inputs randomly transformed by T."""

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        logits = self.backbone(self.prepare(x, transform=True))
        loss = F.cross_entropy(logits.float(), y)
        self._track(loss)
        return loss


class ProximalModule(SupervisedModule):
    """Cross-entropy plus Ditto's proximal term: ``F_i(v) + lam / 2 * ||v - w||^2`` over the backbone's parameters
    v and a fixed ``anchor`` w (the global model), so each step moves v by ``-lr * (grad F_i(v) + lam (v - w))``.

    Source: T. Li, S. Hu, A. Beirami, V. Smith, "Ditto: Fair and Robust Federated Learning Through
    Personalization", ICML 2021, Eq. 2 and Algorithm 1 (the personal update). The logged parts are ``ce`` and
    ``prox`` (``lam / 2 * ||v - w||^2``).

    Args:
        anchor: w, one tensor per parameter of ``backbone`` in ``backbone.parameters()`` order (kept as buffers,
            so they follow the module to its device).
        lam: lambda >= 0 (0: plain cross-entropy).
    """

    def __init__(self, backbone, anchor: list[torch.Tensor], lam: float, *args, **kwargs) -> None:
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
        distance = sum(((p.float() - getattr(self, f"anchor_{j}").float()) ** 2).sum()
                       for j, p in enumerate(self.backbone.parameters()))
        prox = 0.5 * self.lam * distance
        loss = ce + prox
        self._track(loss, ce=ce, prox=prox)
        return loss

"""Supervised cross-entropy on a client's labelled local data (COSMOS paper, Section 4.1 Step 1 and 4.2 Step 1)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from cosmos_pl.modules.base import CosmosModule


class SupervisedModule(CosmosModule):
    """Cross-entropy on batches ``(x uint8 [B, C, H, W], y int64 [B])``, inputs randomly transformed by T."""

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        logits = self.backbone(self.prepare(x, transform=True))
        loss = F.cross_entropy(logits.float(), y)
        self._track(loss)
        return loss

"""The shared LightningModule: a backbone fed uint8 batches that it normalizes and transforms on the device."""

from __future__ import annotations

from typing import Callable, Iterable

import lightning.pytorch as pl
import torch
from torch import nn

from cosmos_pl.transforms import Transformations, prepare

OptimizerFactory = Callable[[Iterable[torch.nn.Parameter]], torch.optim.Optimizer]


def default_optimizer(lr: float) -> OptimizerFactory:
    """Adam at ``lr``: 1e-3 on labels, 1e-4 on pseudo-labels (COSMOS paper, Appendix C)."""

    def make(params: Iterable[torch.nn.Parameter]) -> torch.optim.Optimizer:
        return torch.optim.Adam(params, lr=lr)

    return make


class CosmosModule(pl.LightningModule):
    """A backbone with its optimizer; subclasses define ``training_step`` for one objective.

    Args:
        backbone: maps float ``[B, C, H, W]`` in [-1, 1] to logits ``[B, M]``.
        optimizer: called with the parameters, returns the optimizer (a jsonargparse/Lightning OptimizerCallable).
        transformations: the permissible transformations T and radius d (None: no augmentation).
        channels_last: run the backbone in channels-last memory format (faster convolutions).
    """

    def __init__(
        self,
        backbone: nn.Module,
        optimizer: OptimizerFactory,
        transformations: Transformations | None = None,
        channels_last: bool = False,
    ) -> None:
        super().__init__()
        self.channels_last = channels_last
        self.backbone = backbone.to(memory_format=torch.channels_last) if channels_last else backbone
        self.optimizer_factory = optimizer
        self.transformations = transformations
        self.epoch_losses: list[float] = []
        self.epoch_parts: list[dict[str, float]] = []
        self._sums: dict[str, torch.Tensor] = {}
        self._batches = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """uint8 ``[B, C, H, W]`` -> logits ``[B, M]`` on clean (untransformed) inputs."""
        return self.backbone(self.prepare(x))

    def prepare(self, x: torch.Tensor, transform: bool = False, perturb: bool = False) -> torch.Tensor:
        """uint8 batch -> model input; ``transform`` applies T, ``perturb`` draws x' in B(x)."""
        t = self.transformations if (transform or perturb) else None
        return prepare(x, t, perturb=perturb, channels_last=self.channels_last)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return self.optimizer_factory(self.parameters())

    def _track(self, loss: torch.Tensor, **parts: torch.Tensor) -> None:
        """Accumulate the total loss and its named parts (e.g. ``kl``, ``r_b``) on the device: one host
        sync per epoch, not per step."""
        for name, value in {"loss": loss, **parts}.items():
            value = value.detach().float()
            self._sums[name] = self._sums[name] + value if name in self._sums else value
        self._batches += 1

    def on_train_epoch_end(self) -> None:
        if self._batches:
            means = {name: float(total) / self._batches for name, total in self._sums.items()}
            self.epoch_losses.append(means["loss"])
            self.epoch_parts.append(means)
        self._sums = {}
        self._batches = 0

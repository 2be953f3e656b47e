"""pFedHN's inner loop: a fixed number of SGD steps on the client's data from the generated weights.

Source: A. Shamsian, A. Navon, E. Fetaya, G. Chechik, "Personalized Federated Learning using Hypernetworks", ICML
2021, Algorithm 1 (the client's K local steps from theta_i = h(v_i; phi)); the values are the official code's
(``AvivSham/pFedHN`` ``experiments/pfedhn/trainer.py``): ``inner_steps`` 50 mini-batch steps of SGD with lr 5e-3,
momentum 0.9, weight decay 5e-5, the gradient's norm clipped to 50, a fresh optimizer each time. The step
:class:`PFedHNFit`, its LightningModule :class:`InnerStepsModule` and its stage :func:`fit_inner_steps`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Optional

import torch
from torch import nn

from cosmos_pl.objectives.local_fit import SupervisedModule
from cosmos_pl.objectives.stage import run_stage
from cosmos_pl.objectives.step import ClientStep, StepSettings, Task

if TYPE_CHECKING:
    from cosmos_pl.training.client import Client

__all__ = ["PFedHNFit", "InnerStepsModule", "fit_inner_steps"]


class InnerStepsModule(SupervisedModule):
    """Cross-entropy on batches ``(x uint8 [B, C, H, W], y int64 [B])`` (inputs transformed by T), the gradient's
    norm over all trained parameters clipped to ``clip`` before each optimizer step (0: no clipping). The other
    arguments are :class:`~cosmos_pl.training.module.CosmosModule`'s."""

    def __init__(self, backbone: nn.Module, *args: Any, clip: float, **kwargs: Any) -> None:
        super().__init__(backbone, *args, **kwargs)
        self.clip = clip

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        if self.clip > 0:
            torch.nn.utils.clip_grad_norm_([p for p in self.parameters() if p.requires_grad], self.clip)


def fit_inner_steps(model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, steps: int, lr: float, momentum: float,
                    weight_decay: float, clip: float, **stage: Any) -> list[dict[str, float]]:
    """Train ``model`` in place for ``steps`` mini-batch steps of cross-entropy on ``x`` uint8 ``[n, C, H, W]``,
    ``y`` int64 ``[n]`` (shuffled batches, a new order each pass over the data) with a fresh
    ``SGD(lr, momentum, weight_decay)`` and gradient-norm clipping at ``clip`` (:class:`InnerStepsModule`; ``stage``:
    :func:`~cosmos_pl.objectives.stage.run_stage`'s settings but the optimizer). Returns one dict per pass over the
    data with the mean training ``loss`` (nothing for ``steps <= 0``).

    Raises:
        DivergenceError: a step's loss, or the weights after training, are non-finite.
    """
    if steps <= 0:
        return []
    optimizer = functools.partial(torch.optim.SGD, lr=lr, momentum=momentum, weight_decay=weight_decay)
    stage.update(optimizer=optimizer, optimizer_key="")
    return run_stage(model, InnerStepsModule, (x, y), epochs=1, steps=steps, clip=clip, **stage)


@dataclass(frozen=True)
class PFedHNFit(ClientStep):
    """pFedHN's inner loop: ``steps`` mini-batch SGD steps (``lr``, ``momentum``, ``weight_decay``, gradient norm
    clipped to ``clip``; a fresh optimizer, not ``clients.optimizer``) of cross-entropy on D_i, from the weights the
    client holds (:func:`fit_inner_steps`). No target: the generated weights were loaded at the end of the last
    round."""

    steps: int
    lr: float
    momentum: float
    weight_decay: float
    clip: float
    stage: ClassVar[str] = "inner steps"
    needs_target: ClassVar[bool] = False
    seed_stage: ClassVar[str] = "hn_inner"
    stage_id: ClassVar[int] = 13

    def idle(self) -> bool:
        return self.steps <= 0

    def task(self, runtime: StepSettings, client: "Client", rnd: int, target: Optional[torch.Tensor]) -> Task:
        arguments = self.stage_arguments(runtime, client, rnd)
        arguments.pop("optimizer")
        arguments.pop("optimizer_key")
        return fit_inner_steps, dict(arguments, x=client.data.x, y=client.data.y, steps=self.steps, lr=self.lr,
                                     momentum=self.momentum, weight_decay=self.weight_decay, clip=self.clip)

"""FedSelect's client round: merge the server's per-index average, grow the personal mask on schedule, then LocalAlt.

Source: R. Tamirisa et al., "FedSelect: Personalized Federated Learning with Customized Selection of Parameters for
Fine-Tuning", CVPR 2024 (arXiv 2404.02478), Algorithm 1 (GradSelect, LocalAlt); the official code
``lapisrocks/fedselect`` (``fedselect.py``, ``lottery_ticket.get_mask_from_delta``, ``pflopt/optimizers.py``).
The step :class:`SelectFit`, the mask growth :func:`grow_count` / :func:`grow_mask` / :func:`grow_masks`, the
LightningModule :class:`SelectModule` and the stage :func:`fit_select`. The client's model is a
:class:`~cosmos_pl.models.selective.Selective`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Optional

import torch
import torch.nn.functional as F
from torch import nn

from cosmos_pl.objectives.stage import run_stage
from cosmos_pl.objectives.step import ClientStep, StepSettings, Task
from cosmos_pl.training.module import CosmosModule

if TYPE_CHECKING:
    from cosmos_pl.models.selective import Selective
    from cosmos_pl.training.client import Client

__all__ = ["SelectFit", "SelectModule", "fit_select", "grow_count", "grow_mask", "grow_masks", "grows_before"]

# the float products rate * n and limit * n are rounded with this slack, so that e.g. 0.29 * 100 (28.999...) counts
# as 29, as the decimal settings mean
_SLACK = 1e-9


def grow_count(size: int, personal: int, rate: float, limit: float) -> int:
    """How many shared entries of one tensor become personal at a mask update.

    ``k = min(floor(rate * shared + 1/2), floor(limit * size) - personal)``, at least 0, with ``shared = size -
    personal``: the growth rate p of the remaining shared entries rounded half up (numpy's half-to-even
    ``np.round`` of the official code gives 2 of 10 at p = 0.25, this gives 3), then capped so the personal fraction
    never passes alpha (the official code checks ``> alpha`` before growing and overshoots it).

    Args:
        size: the tensor's entries n.
        personal: its entries already personal.
        rate: p in [0, 1].
        limit: alpha in [0, 1], the largest personal fraction.
    """
    shared = size - personal
    k = min(shared, math.floor(rate * shared + 0.5 + _SLACK))
    cap = math.floor(limit * size + _SLACK)
    return max(0, min(k, cap - personal))


def grow_mask(mask: torch.Tensor, delta: torch.Tensor, rate: float, limit: float) -> torch.Tensor:
    """GradSelect on one tensor: the :func:`grow_count` shared entries (``mask == 0``) with the largest ``|delta|``
    become personal; equal ``|delta|`` are taken in index order (row-major), so exactly k entries are added.

    Args:
        mask: uint8, 1 = personal, any shape.
        delta: the weights' change since the last update, the shape of ``mask``.
        rate: p, the fraction of the shared entries that grows.
        limit: alpha, the largest personal fraction.

    Returns:
        The new uint8 mask (a new tensor; ``mask`` is unchanged).
    """
    flat = mask.reshape(-1).clone()
    shared = (flat == 0).nonzero().squeeze(1)
    k = grow_count(flat.numel(), flat.numel() - shared.numel(), rate, limit)
    if k > 0:
        scores = delta.reshape(-1)[shared].abs()
        chosen = torch.sort(scores, descending=True, stable=True).indices[:k]
        flat[shared[chosen]] = 1
    return flat.view_as(mask)


@torch.no_grad()
def grow_masks(model: "Selective", rate: float, limit: float) -> None:
    """One mask update of ``model`` (official ``delta_update``): every parameter whose name contains ``"weight"``
    (convolutions, linear layers, BatchNorm's gamma; biases stay shared) grows its mask from ``|theta -
    snapshot|`` (:func:`grow_mask`); then ``snapshot <- theta`` for every parameter."""
    named = list(model.model.named_parameters())
    for (name, p), mask, snap in zip(named, model.masks(), model.snapshots()):
        if "weight" in name:
            mask.copy_(grow_mask(mask, p.detach() - snap, rate, limit))
        snap.copy_(p.detach())


def grows_before(rnd: int, every: int) -> bool:
    """Whether round ``rnd``'s :class:`SelectFit` starts with a mask update: after round ``rnd - 1``'s training when
    ``rnd - 1`` is a positive multiple of ``every`` (official: after round ``r`` with ``r % every == 0 and r != 0``,
    round 0 here being the clients' local start); never for ``every <= 0``."""
    return every > 0 and rnd > 1 and (rnd - 1) % every == 0


class SelectModule(CosmosModule):
    """LocalAlt (official ``local_alt`` with ``MaskLocalAltSGD``): cross-entropy on batches ``(x uint8 [B, C, H, W],
    y int64 [B])``, inputs transformed by T, even epochs (0, 2, ...) training the personal entries only and odd
    epochs the shared entries only. The other entries' gradients are zeroed after the backward pass, and their values
    are written back after every optimizer step, so neither momentum, Adam's moments nor weight decay moves them:
    they stay bit-identical. The backbone and the other arguments are :class:`CosmosModule`'s.

    Args:
        masks: uint8 ``[*param.shape]`` per parameter of ``backbone`` in ``backbone.parameters()`` order
            (1 = personal).

    Raises:
        ValueError: not one mask per parameter, of the same shapes.
    """

    def __init__(self, backbone: nn.Module, *args: Any, masks: list[torch.Tensor], **kwargs: Any) -> None:
        super().__init__(backbone, *args, **kwargs)
        params = list(self.backbone.parameters())
        if len(masks) != len(params) or any(m.shape != p.shape for m, p in zip(masks, params)):
            raise ValueError("SelectModule: the masks must have one tensor per parameter, of the same shapes")
        for j, m in enumerate(masks):  # buffers: they follow the module to its device
            self.register_buffer(f"personal_{j}", m.bool(), persistent=False)

    def trainable(self) -> list[torch.Tensor]:
        """Per parameter, the bool entries this epoch trains: the personal ones on even epochs, the shared on odd."""
        personal = [getattr(self, f"personal_{j}") for j in range(len(list(self.backbone.parameters())))]
        return personal if self.current_epoch % 2 == 0 else [~m for m in personal]

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.cross_entropy(self.backbone(self.prepare(x, transform=True)).float(), y)
        self._track(loss)
        return loss

    def on_after_backward(self) -> None:
        for p, train in zip(self.backbone.parameters(), self.trainable()):
            if p.grad is not None:
                p.grad.masked_fill_(~train, 0)

    def optimizer_step(self, epoch: int, batch_idx: int, optimizer: Any, optimizer_closure: Any = None) -> None:
        frozen = [(p, p.detach().clone(), ~train) for p, train in zip(self.backbone.parameters(), self.trainable())
                  if not bool(train.all())]
        super().optimizer_step(epoch, batch_idx, optimizer, optimizer_closure)
        with torch.no_grad():
            for p, saved, keep in frozen:
                p.copy_(torch.where(keep, saved, p))


def fit_select(model: "Selective", x: torch.Tensor, y: torch.Tensor, *, epochs: int, rate: float, limit: float,
               grow: bool, **stage: Any) -> list[dict[str, float]]:
    """FedSelect's client round on ``model`` (a :class:`~cosmos_pl.models.selective.Selective`), in place, on ``x``
    uint8 ``[n, C, H, W]``, ``y`` int64 ``[n]``:

    1. when ``grow``, a mask update (:func:`grow_masks`) from the weights as the last round's training left them;
    2. the server's pending average merged into the entries shared under the mask the client uploaded with (the
       official broadcast uses that mask, so entries that just became personal take the average too);
    3. LocalAlt for ``epochs``: per epoch a pass over the data on the personal entries, then one on the shared
       entries (:class:`SelectModule`, one optimizer for the ``2 * epochs`` passes; ``stage``:
       :func:`~cosmos_pl.objectives.stage.run_stage`'s settings).

    Returns one dict per pass (``loss``).

    Raises:
        DivergenceError: a step's loss, or the weights after training, are non-finite.
    """
    uploaded = [m.clone() for m in model.masks()]
    if grow:
        grow_masks(model, rate, limit)
    model.merge_pending(uploaded)
    return run_stage(model, SelectModule, (x, y), epochs=2 * epochs, masks=model.masks(), **stage)


@dataclass(frozen=True)
class SelectFit(ClientStep):
    """FedSelect's client round (:func:`fit_select`): merge the server's average, grow the personal mask by
    ``rate`` of the shared entries up to ``limit`` when the round follows a multiple of ``every``
    (:func:`grows_before`), then LocalAlt for ``epochs`` epochs (``clients.optimizer``). No target: the average
    rides in the client's model since the last round's weights load."""

    epochs: int
    rate: float
    limit: float
    every: int
    stage: ClassVar[str] = "selective training"
    needs_target: ClassVar[bool] = False
    seed_stage: ClassVar[str] = "select"
    stage_id: ClassVar[int] = 11

    def idle(self) -> bool:
        return False  # a merge and a mask update are due even without a training epoch

    def task(self, runtime: StepSettings, client: "Client", rnd: int, target: Optional[torch.Tensor]) -> Task:
        return fit_select, dict(self.stage_arguments(runtime, client, rnd), x=client.data.x, y=client.data.y,
                                epochs=self.epochs, rate=self.rate, limit=self.limit,
                                grow=grows_before(rnd, self.every))

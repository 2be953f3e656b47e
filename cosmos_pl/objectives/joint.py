"""Cross-entropy on local data plus distillation to soft targets on U in every step (COMET's client objective).

Source: Cho et al., "Communication-Efficient and Model-Heterogeneous Personalized Federated Learning via Clustered
Knowledge Transfer" (COMET), IEEE JSTSP 2023, the client's local objective. Here: the loss :func:`joint_loss`, the
LightningModule :class:`JointModule`, the paired batches of D_i and U (:func:`paired_batches`), the stage
:func:`fit_joint` and the client step :class:`JointFit`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Optional

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset, Sampler

from cosmos_pl.losses import kl_per_sample
from cosmos_pl.objectives.stage import run_stage
from cosmos_pl.objectives.step import ClientStep, StepSettings, Task
from cosmos_pl.training.module import LARGE_LAMBDA, CosmosModule, OptimizerFactory
from cosmos_pl.transforms import Transformations

if TYPE_CHECKING:
    from cosmos_pl.training.client import Client

__all__ = ["JointBatches", "JointFit", "JointModule", "PairedBatches", "fit_joint", "joint_loss", "paired_batches"]


def joint_loss(local_logits: torch.Tensor, y: torch.Tensor, public_logits: torch.Tensor, targets: torch.Tensor,
               lam: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``CE(local_logits, y) + lam * (1/B_u) sum_u KL(t(u) || f(u))`` for one step.

    Args:
        local_logits: ``[B, M]`` logits on a batch of D_i; y: ``[B]`` its labels.
        public_logits: ``[B_u, M]`` logits on a batch of U; targets: ``[B_u, M]`` its soft targets t(u).
        lam: lambda >= 0, the weight of the distillation term.

    Returns:
        (total, ce, kl): scalars (total = ce + lam * kl).
    """
    ce = F.cross_entropy(local_logits.float(), y)
    kl = kl_per_sample(torch.log_softmax(public_logits.float(), dim=1), targets.float()).mean()
    return ce + lam * kl, ce, kl


class JointModule(CosmosModule):
    """``CE(f(T(x)), y) + lam * (1/B_u) sum_u KL(t(u) || f(u))`` per step (:func:`joint_loss`).

    Batches are ``(x uint8 [B, C, H, W], y int64 [B], u uint8 [B_u, C, H, W], t float [B_u, M])``: a batch of
    the client's labelled data D_i (randomly transformed by T) and a batch of the public set U with its
    targets (clean, as in the KL term of Eq. 2). Both go through the backbone in one forward pass.

    ``where`` and ``optimizer_key`` name the stage and the optimizer setting in error messages (see
    :class:`CosmosModule`).

    Raises:
        ValueError: lam < 0.
        DivergenceError: a training step's loss is non-finite.
    """

    def __init__(self, backbone: nn.Module, optimizer: OptimizerFactory, transformations: Transformations | None = None,
                 lam: float = 1.0, *, channels_last: bool = False, where: str = "training",
                 optimizer_key: str = "") -> None:
        if lam < 0:
            raise ValueError(f"lambda_={lam}: the weight of the distillation term must be >= 0")
        super().__init__(backbone, optimizer, transformations, channels_last=channels_last, where=where,
                         optimizer_key=optimizer_key)
        self.lam = lam

    def _more_fixes(self) -> str:
        return f", or lambda, the weight of the distillation term (now {self.lam:g})" if not self.lam <= LARGE_LAMBDA \
            else ""

    def training_step(self, batch: tuple[torch.Tensor, ...], batch_idx: int) -> torch.Tensor:
        x, y, u, t = batch
        b = x.shape[0]
        logits = self.backbone(torch.cat([self.prepare(x, transform=True), self.prepare(u)]))
        loss, ce, kl = joint_loss(logits[:b], y, logits[b:], t, self.lam)
        self._track(loss, ce=ce, kl=kl)
        return loss


class PairedBatches(Sampler):
    """Index pairs for one epoch over D_i: each step a batch of D_i (a random permutation) with a batch of U
    of the same size, U taken in reshuffled passes so every public sample is used before any repeats. The orders
    are drawn on the CPU and go to ``device`` (the data's) once per epoch: each pair is two slices there, with no
    host-to-device copy per step."""

    def __init__(self, n_local: int, n_public: int, batch_size: int, device: torch.device | str = "cpu") -> None:
        self.n_local, self.n_public, self.batch_size, self.device = n_local, n_public, batch_size, device
        # drop a last local batch of 1: BatchNorm cannot train on a single sample
        self.steps = n_local // batch_size if n_local > batch_size and n_local % batch_size == 1 else \
            -(-n_local // batch_size)

    def __len__(self) -> int:
        return self.steps

    def __iter__(self):
        b = self.batch_size
        local = torch.randperm(self.n_local).to(self.device, non_blocking=True)
        passes = -(-self.steps * b // self.n_public)
        public = torch.cat([torch.randperm(self.n_public) for _ in range(passes)]).to(self.device, non_blocking=True)
        for s in range(self.steps):
            yield local[s * b:(s + 1) * b], public[s * b:(s + 1) * b]


class JointBatches(Dataset):
    """``(x, y, u, t)`` batches gathered by a :class:`PairedBatches` index pair (local indices, public indices:
    int64 tensors on the data's device, or lists)."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, u: torch.Tensor, t: torch.Tensor) -> None:
        self.local, self.public = (x, y), (u, t)

    def __len__(self) -> int:
        return len(self.local[0])

    def __getitem__(self, pair: tuple[torch.Tensor | list[int], torch.Tensor | list[int]]) -> tuple[torch.Tensor, ...]:
        li, pi = torch.as_tensor(pair[0]), torch.as_tensor(pair[1])
        return self.local[0][li], self.local[1][li], self.public[0][pi], self.public[1][pi]


def paired_batches(data: tuple[torch.Tensor, ...], batch_size: int) -> DataLoader:
    """The batches of :func:`fit_joint`: ``data`` = (x, y, u, t) on the device, paired by :class:`PairedBatches`."""
    joined = JointBatches(*data)
    sampler = PairedBatches(len(data[0]), len(data[2]), batch_size, device=data[0].device)
    return DataLoader(joined, sampler=sampler, batch_size=None, num_workers=0)


def fit_joint(model: nn.Module, x: torch.Tensor, y: torch.Tensor, public: torch.Tensor, targets: torch.Tensor, *,
              lam: float, **stage: Any) -> list[dict[str, float]]:
    """Train ``model`` in place on D_i = (``x`` uint8 ``[n_i, C, H, W]``, ``y`` ``[n_i]``) and U = ``public``
    ``[n, C, H, W]`` with soft ``targets`` ``[n, M]``: each step ``CE + lam * KL`` (:class:`JointModule`;
    ``stage``: :func:`~cosmos_pl.objectives.stage.run_stage`'s settings).

    An epoch is one pass over D_i (:func:`paired_batches`). Returns one dict per epoch with the mean ``loss``, ``ce``
    and ``kl``.

    Raises:
        DivergenceError: non-finite targets, a non-finite step loss, or non-finite weights after training.
    """
    return run_stage(model, JointModule, (x, y, public, targets.float()), targets=targets, batches=paired_batches,
                     lam=lam, **stage)


@dataclass(frozen=True)
class JointFit(ClientStep):
    """Per step: cross-entropy on a batch of D_i plus ``lam`` * KL(target || f(u)) on a batch of U (COMET).

    An epoch is one pass over D_i; U batches of the same size are drawn in reshuffled passes over U.
    Uses ``clients.optimizer``.
    """

    epochs: int
    lam: float
    stage: ClassVar[str] = "joint training"
    seed_stage: ClassVar[str] = "joint"
    stage_id: ClassVar[int] = 5

    def task(self, runtime: StepSettings, client: "Client", rnd: int, target: Optional[torch.Tensor]) -> Task:
        return fit_joint, dict(self.stage_arguments(runtime, client, rnd), x=client.data.x, y=client.data.y,
                               public=runtime.public, targets=target, epochs=self.epochs, lam=self.lam)

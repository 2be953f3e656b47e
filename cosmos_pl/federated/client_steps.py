"""What one client does in a round, as a task: the same code runs in-process (the executor) and on a Flower node.

Every client step (local fit, pseudo-labels on U and their encoding, distillation, joint fit, co-training,
evaluation) is built here from the step object of :mod:`cosmos_pl.algorithms.base` and the client's own model and
data. The in-process runner hands these tasks to its executor; a Flower ``ClientApp`` (:mod:`cosmos_pl.flower`)
runs the very same task on the node that holds the client, so the two transports train with identical code,
seeds and numbers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch import nn

from cosmos_pl.algorithms.base import Distill, JointFit, LocalFit, Step, UnionFit
from cosmos_pl.communication import CommunicationConfig, Payload, encode, encode_hard
from cosmos_pl.federated.client import Client, ClientConfig
from cosmos_pl.federated.trainer_config import TrainerConfig, stage_seed
from cosmos_pl.losses import adjust_to_prior
from cosmos_pl.transforms import Transformations

__all__ = ["ClientSteps", "STAGE_OF", "stage_of", "encode_upload"]

# the stage name of each training step: progress display, timings, loss columns and failure records
STAGE_OF = {LocalFit: "local training", Distill: "client distillation", JointFit: "joint training",
            UnionFit: "co-training"}

Task = tuple[Any, dict[str, Any]]


class _Stage:
    """A function of :mod:`cosmos_pl.federated.stages`, imported when the task runs: building a client's task (a
    Flower node answering ``hello``, the in-process runner) does not import Lightning; running a training task
    does. Picklable by name, so a task travels to a worker process as before."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from cosmos_pl.federated import stages

        return getattr(stages, self.name)(*args, **kwargs)

    def __repr__(self) -> str:
        return f"cosmos_pl.federated.stages.{self.name}"


fit_supervised, fit_distillation, fit_joint, predict_probs, evaluate_models = (
    _Stage(name) for name in ("fit_supervised", "fit_distillation", "fit_joint", "predict_probs", "evaluate_models"))


def stage_of(step: Step) -> str:
    """The stage name of a training step (``"client distillation"`` for :class:`Distill`, ...)."""
    return STAGE_OF[type(step)]


@dataclass
class ClientSteps:
    """The settings every client step reads (the same on the server and on every node).

    Attributes:
        seed: the experiment seed; each step is seeded from (seed, round, stage, client id).
        clients: epochs, batch size and optimizers (``ClientConfig``).
        transformations: augmentation T and the views of r_B.
        trainer: devices and precision of every stage.
        public: U, uint8 ``[n, C, H, W]``.
        num_classes: M.
    """

    seed: int
    clients: ClientConfig
    transformations: Transformations
    trainer: TrainerConfig
    public: torch.Tensor
    num_classes: int

    def train(self, client: Client, rnd: int, step: Step, target: Optional[torch.Tensor] = None) -> Task:
        """The task training ``client.model`` for one step of round ``rnd``; ``target`` ``[n, M]`` is what the
        server sent for :class:`Distill`, :class:`JointFit` and :class:`UnionFit` (ignored by :class:`LocalFit`).
        The task returns the per-epoch losses (``[{"loss": ..., ...}]``)."""
        c, cc = client, self.clients
        where = f"round {rnd}, {stage_of(step)}, client {c.id}"
        common = dict(model=c.model, batch_size=cc.batch_size, transformations=self.transformations,
                      trainer=self.trainer, where=where)
        if isinstance(step, LocalFit):
            return fit_supervised, dict(common, x=c.data.x, y=c.data.y, epochs=step.epochs, optimizer=cc.optimizer,
                                        seed=stage_seed(self.seed, rnd, "local", c.id), optimizer_key="clients.optimizer")
        if isinstance(step, Distill):
            if step.prior_correction:  # each client shifts the target to its own label prior; nothing extra is sent
                target = adjust_to_prior(target, torch.bincount(c.data.y, minlength=self.num_classes))
            return fit_distillation, dict(
                common, x=self.public, targets=target, epochs=step.epochs, optimizer=cc.distill_optimizer, lam=step.lam,
                num_views=step.num_views, seed=stage_seed(self.seed, rnd, "distill", c.id),
                target_grad=step.target_grad, augment=step.augment, freeze_bn=step.freeze_bn,
                optimizer_key="clients.distill_optimizer")
        if isinstance(step, JointFit):
            return fit_joint, dict(common, x=c.data.x, y=c.data.y, public=self.public, targets=target,
                                   epochs=step.epochs, optimizer=cc.optimizer, lam=step.lam,
                                   seed=stage_seed(self.seed, rnd, "joint", c.id), optimizer_key="clients.optimizer")
        if isinstance(step, UnionFit):
            return fit_supervised, dict(common, x=torch.cat([c.data.x, self.public]),
                                        y=torch.cat([c.data.y, target.argmax(1)]), epochs=step.epochs,
                                        optimizer=cc.optimizer, seed=stage_seed(self.seed, rnd, "union", c.id),
                                        optimizer_key="clients.optimizer")
        raise TypeError(f"not a client training step: {step!r}")

    def predict(self, client: Client, rnd: int) -> Task:
        """The task computing ``client``'s soft pseudo-labels on U, float32 ``[n, M]``."""
        return predict_probs, dict(model=client.model, x=self.public, trainer=self.trainer,
                                   where=f"round {rnd}, pseudo-labels on U, client {client.id}")

    def evaluate(self, client: Client, rnd: int, models: Optional[dict[str, nn.Module]] = None) -> list[tuple[str, Task]]:
        """``(split, task)`` per split the client has ("test", and "val" when there is a validation split); each
        task scores ``models`` (default: the client's own f_i as ``"client"``) on that split of the client's data
        and returns ``{name: {"top1": ..., "top5": ...}}`` (fractions; NaN on an empty split)."""
        models = {"client": client.model} if models is None else models
        d = client.data
        return [(split, (evaluate_models, dict(models=models, x=x, y=y, num_classes=self.num_classes,
                                               trainer=self.trainer,
                                               where=f"round {rnd}, evaluation ({split}), client {client.id}")))
                for split, x, y in (("test", d.x_test, d.y_test), ("val", d.x_val, d.y_val)) if y is not None]


def encode_upload(probs: torch.Tensor, kind: str, comm: CommunicationConfig, fingerprint: str) -> Payload:
    """A client's pseudo-labels ``[n, M]`` encoded as sent: class indices for ``kind == "hard"``, else per the
    ``communication`` options (dtype, top-k), tagged with U's ``fingerprint``.

    Raises:
        DivergenceError: ``probs`` holds a NaN or an infinity.
    """
    if kind == "hard":
        return encode_hard(probs, fingerprint)
    return encode(probs, comm.upload_dtype, comm.top_k, fingerprint)


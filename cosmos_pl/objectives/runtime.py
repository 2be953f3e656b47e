"""The client runtime: the settings every client step reads, and the tasks it builds for a client.

The same on the server (in-process workers) and on every Flower node: :meth:`ClientRuntime.train` asks the step for
its task (:meth:`~cosmos_pl.objectives.step.ClientStep.task`, which reads the runtime as
:class:`~cosmos_pl.objectives.step.StepSettings`), :meth:`ClientRuntime.predict` and
:meth:`ClientRuntime.evaluate` build the inference tasks; :func:`encode_upload` encodes pseudo-labels as sent.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn

from cosmos_pl.communication import CommunicationConfig, Payload, encode, encode_hard
from cosmos_pl.objectives.step import ClientStep, Task
from cosmos_pl.training.client import Client, ClientConfig
from cosmos_pl.training.config import TrainerConfig
from cosmos_pl.training.inference import evaluate_models, predict_probs, teacher_prior
from cosmos_pl.transforms import Transformations

__all__ = ["ClientRuntime", "encode_upload"]


@dataclass
class ClientRuntime:
    """The settings every client step reads (the same on the server and on every node), and the tasks it builds.

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

    def train(self, client: Client, rnd: int, step: ClientStep, target: Optional[torch.Tensor] = None) -> Task:
        """The task training ``client.model`` for one step of round ``rnd`` (:meth:`ClientStep.task`).

        Raises:
            TypeError: ``step`` is not a training step (an Upload or LoadWeights, which the round loop handles).
        """
        if not isinstance(step, ClientStep):
            raise TypeError(f"not a client training step: {step!r}")
        return step.task(self, client, rnd, target)

    def predict(self, client: Client, rnd: int) -> Task:
        """The task computing ``client``'s soft pseudo-labels on U, float32 ``[n, M]``."""
        return predict_probs, dict(model=client.model, x=self.public, trainer=self.trainer,
                                   where=f"round {rnd}, pseudo-labels on U, client {client.id}", keep_on_device=True)

    def prior(self, teacher: nn.Module, rnd: int, where: str) -> Task:
        """The task computing the prior ``teacher`` carries, its mean output on U, float32 ``[M]``
        (:func:`~cosmos_pl.training.inference.teacher_prior`): once per teacher and round, for :meth:`evaluate`
        of each of its clients. ``where`` names the teacher in an error."""
        return teacher_prior, dict(model=teacher, public=self.public, trainer=self.trainer,
                                   where=f"round {rnd}, evaluation, {where} on U")

    def evaluate(self, client: Client, rnd: int, models: Optional[dict[str, nn.Module]] = None,
                 carried: Optional[torch.Tensor] = None) -> list[tuple[str, Task]]:
        """``(split, task)`` per split the client has ("test", and "val" when there is a validation split); each
        task scores ``models`` (default: the client's own f_i as ``"client"``) on that split of the client's data
        and returns ``{name: {"top1": ..., "top5": ...}}`` (fractions; NaN on an empty split); a ``"teacher"`` is
        scored as ``"teacher_prior"`` too (:func:`~cosmos_pl.training.inference.evaluate_models`), with the prior
        it carries: ``carried`` (``[M]``, from the task of :meth:`prior`), else computed from U in each task."""
        models = {"client": client.model} if models is None else models
        d = client.data
        # a teacher is also scored shifted to the client's own label prior (from its own labels, on the client)
        prior = dict(class_counts=torch.bincount(d.y, minlength=self.num_classes),
                     **(dict(carried=carried) if carried is not None else dict(public=self.public))) \
            if "teacher" in models else {}
        return [(split, (evaluate_models, dict(models=models, x=x, y=y, num_classes=self.num_classes,
                                               trainer=self.trainer, **prior,
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

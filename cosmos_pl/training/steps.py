"""The client steps a round is made of, and the client runtime that runs them.

A round is an ordered list of steps (an algorithm's :meth:`~cosmos_pl.algorithms.base.Algorithm.plan`). Two are
protocol steps the round loop handles itself: :class:`Upload` (what each client sends) and :class:`LoadWeights`
(FedAvg's replacement of the weights). The others are training objectives, :class:`ClientStep` subclasses, and each
carries, in its own class, everything about it:

- its fields (the settings the server sends with it) and its ``stage`` name (records, progress, failures);
- its client behaviour, :meth:`ClientStep.task`: the training task it is on a client's own model and data;
- its wire encoding, :meth:`ClientStep.to_wire` / :meth:`ClientStep.from_wire`: plain values and tensors, the same
  on every transport (the Flower transport wraps them in its records).

A new objective is one subclass here; the in-process workers and the Flower nodes run it unchanged through
:class:`ClientRuntime`, which holds the settings every step reads (the same on the server and on every node).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Optional, Union

import torch
from torch import nn

from cosmos_pl.communication import CommunicationConfig, Payload, encode, encode_hard
from cosmos_pl.losses import adjust_to_prior
from cosmos_pl.models.personal import PersonalAndGlobal
from cosmos_pl.training.client import Client, ClientConfig
from cosmos_pl.training.config import TrainerConfig, stage_seed
from cosmos_pl.transforms import Transformations

__all__ = ["ClientStep", "LocalFit", "Upload", "Distill", "JointFit", "UnionFit", "LoadWeights", "ProxFit", "FineTune",
           "StartGlobal", "Step",
           "CLIENT_STEPS", "stage_of", "steps_to_wire", "steps_from_wire", "ClientRuntime", "encode_upload", "Task"]

Task = tuple[Any, dict[str, Any]]


class _Stage:
    """A function of :mod:`cosmos_pl.training.stages`, imported when the task runs: building a client's task (a
    Flower node answering ``hello``, the in-process runner) does not import Lightning; running a training task
    does. Picklable by name, so a task travels to a worker process as before."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from cosmos_pl.training import stages

        return getattr(stages, self.name)(*args, **kwargs)

    def __repr__(self) -> str:
        return f"cosmos_pl.training.stages.{self.name}"


fit_supervised, fit_distillation, fit_joint, fit_proximal, fine_tune, start_global, predict_probs, evaluate_models = (
    _Stage(name) for name in ("fit_supervised", "fit_distillation", "fit_joint", "fit_proximal", "fine_tune",
                              "start_global", "predict_probs", "evaluate_models"))

CLIENT_STEPS: dict[str, type["ClientStep"]] = {}  # class name -> class: what a node can decode


# --------------------------------------------------------------------------- the steps
class ClientStep:
    """A training objective run on a client's own model (a frozen dataclass in each subclass).

    Subclasses set ``stage`` and implement :meth:`task`; :meth:`to_wire` sends the fields and the target as float32
    ``[n, M]``, which a subclass may encode more compactly. ``needs_target``: the step trains on what the server
    sent this round, so it comes after the round's :class:`Upload` and runs for the clients that got a target; a
    step without one (local training, Ditto's personal step) runs for every client taking part, wherever it is.
    """

    stage: ClassVar[str] = ""
    needs_target: ClassVar[bool] = True

    def idle(self) -> bool:
        """Whether the step has nothing to do and is skipped (a step of 0 epochs)."""
        return getattr(self, "epochs", 1) <= 0

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        CLIENT_STEPS[cls.__name__] = cls

    def task(self, rt: "ClientRuntime", client: Client, rnd: int, target: Optional[torch.Tensor]) -> Task:
        """The task training ``client.model`` for this step of round ``rnd`` (``target`` ``[n, M]``: what the server
        sent; None for steps without one). The task returns the per-epoch losses (``[{"loss": ..., ...}]``)."""
        raise NotImplementedError

    def to_wire(self, target: Optional[torch.Tensor]) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
        """This step as plain values ``{"step": name, "step.<field>": value}`` and its target as tensors
        (``{"target": float32 [n, M]}``; none without a target)."""
        config = {"step": type(self).__name__, **{f"step.{k}": v for k, v in dataclasses.asdict(self).items()}}
        return config, ({} if target is None else {"target": target.float()})

    @classmethod
    def from_wire(cls, config: dict[str, Any], arrays: dict[str, torch.Tensor]) -> tuple["ClientStep",
                                                                                          Optional[torch.Tensor]]:
        """The inverse of :meth:`to_wire` (``config`` holds this step's keys only)."""
        return cls(**{k[5:]: v for k, v in config.items() if k.startswith("step.")}), arrays.get("target")

    def _common(self, rt: "ClientRuntime", client: Client, rnd: int) -> dict[str, Any]:
        return dict(model=client.model, batch_size=rt.clients.batch_size, transformations=rt.transformations,
                    trainer=rt.trainer, where=f"round {rnd}, {self.stage}, client {client.id}")


@dataclass(frozen=True)
class LocalFit(ClientStep):
    """Cross-entropy on the client's own labelled data D_i for ``epochs`` epochs (``clients.optimizer``).

    ``part``: the submodule trained: ``""`` the model the client predicts with (the whole model; the personal model
    of a :class:`~cosmos_pl.models.personal.PersonalAndGlobal`, as round 0 trains it, so that its copy of the global
    model stays at the shared initialization), ``"shared"`` that copy (Ditto's and FedBABU's global update).
    """

    epochs: int
    part: str = ""
    stage: ClassVar[str] = "local training"
    needs_target: ClassVar[bool] = False

    def task(self, rt: "ClientRuntime", client: Client, rnd: int, target: Optional[torch.Tensor]) -> Task:
        part = self.part or ("personal" if isinstance(client.model, PersonalAndGlobal) else "")
        extra = {"part": part} if part else {}
        return fit_supervised, dict(self._common(rt, client, rnd), x=client.data.x, y=client.data.y,
                                    epochs=self.epochs, optimizer=rt.clients.optimizer,
                                    seed=stage_seed(rt.seed, rnd, "local", client.id),
                                    optimizer_key="clients.optimizer", **extra)


@dataclass(frozen=True)
class ProxFit(ClientStep):
    """Ditto's personal update: cross-entropy on D_i plus ``lam / 2 * ||v_i - w||^2`` for ``epochs`` epochs
    (``clients.optimizer``), v_i the client's personal model and w its copy of the global model as it holds it
    (:func:`~cosmos_pl.training.stages.fit_proximal`). No target: w is already on the client."""

    epochs: int
    lam: float
    stage: ClassVar[str] = "personal training"
    needs_target: ClassVar[bool] = False

    def task(self, rt: "ClientRuntime", client: Client, rnd: int, target: Optional[torch.Tensor]) -> Task:
        return fit_proximal, dict(self._common(rt, client, rnd), x=client.data.x, y=client.data.y,
                                  epochs=self.epochs, lam=self.lam, optimizer=rt.clients.optimizer,
                                  seed=stage_seed(rt.seed, rnd, "prox", client.id), optimizer_key="clients.optimizer")


@dataclass(frozen=True)
class FineTune(ClientStep):
    """FedBABU's personalization: the personal model becomes the global one the client holds, then the whole of it
    trains with cross-entropy on D_i for ``epochs`` epochs (``clients.optimizer``;
    :func:`~cosmos_pl.training.stages.fine_tune`). No target."""

    epochs: int
    stage: ClassVar[str] = "fine-tuning"
    needs_target: ClassVar[bool] = False

    def idle(self) -> bool:
        return False  # with 0 epochs it still makes the personal model the global one

    def task(self, rt: "ClientRuntime", client: Client, rnd: int, target: Optional[torch.Tensor]) -> Task:
        return fine_tune, dict(self._common(rt, client, rnd), x=client.data.x, y=client.data.y, epochs=self.epochs,
                               optimizer=rt.clients.optimizer, seed=stage_seed(rt.seed, rnd, "finetune", client.id),
                               optimizer_key="clients.optimizer")


@dataclass(frozen=True)
class StartGlobal(ClientStep):
    """Unless it holds a global model already, the client's copy of the global model takes its round-0 model's
    weights (the body alone when ``with_head`` is False), so the first average starts where FedAvg's does
    (:func:`~cosmos_pl.training.stages.start_global`). In every round's plan: a client that failed its first round,
    or takes part first later, is covered."""

    with_head: bool = True
    stage: ClassVar[str] = "global start"
    needs_target: ClassVar[bool] = False

    def task(self, rt: "ClientRuntime", client: Client, rnd: int, target: Optional[torch.Tensor]) -> Task:
        return start_global, dict(model=client.model, with_head=self.with_head)


@dataclass(frozen=True)
class Distill(ClientStep):
    """Distillation on U to the client's target ``[n, M]``: KL batchmean + ``lam`` * r_B (COSMOS Eq. 2).

    ``lam = 0`` is plain KL distillation (FedMD's digest). Uses ``clients.distill_optimizer``. ``augment`` and
    ``freeze_bn``: see :class:`cosmos_pl.modules.DistillationModule`. ``prior_correction``: each client first
    shifts its target to its own label prior (:func:`cosmos_pl.losses.adjust_to_prior`); nothing extra is sent.
    """

    epochs: int
    lam: float = 0.0
    num_views: int = 1
    target_grad: bool = False
    augment: bool = False
    freeze_bn: bool = False
    prior_correction: bool = False
    stage: ClassVar[str] = "client distillation"

    def task(self, rt: "ClientRuntime", client: Client, rnd: int, target: Optional[torch.Tensor]) -> Task:
        if self.prior_correction:
            target = adjust_to_prior(target, torch.bincount(client.data.y, minlength=rt.num_classes))
        return fit_distillation, dict(
            self._common(rt, client, rnd), x=rt.public, targets=target, epochs=self.epochs,
            optimizer=rt.clients.distill_optimizer, lam=self.lam, num_views=self.num_views,
            seed=stage_seed(rt.seed, rnd, "distill", client.id), target_grad=self.target_grad, augment=self.augment,
            freeze_bn=self.freeze_bn, optimizer_key="clients.distill_optimizer")


@dataclass(frozen=True)
class JointFit(ClientStep):
    """Per step: cross-entropy on a batch of D_i plus ``lam`` * KL(target || f(u)) on a batch of U (COMET).

    An epoch is one pass over D_i; U batches of the same size are drawn in reshuffled passes over U.
    Uses ``clients.optimizer``.
    """

    epochs: int
    lam: float
    stage: ClassVar[str] = "joint training"

    def task(self, rt: "ClientRuntime", client: Client, rnd: int, target: Optional[torch.Tensor]) -> Task:
        return fit_joint, dict(self._common(rt, client, rnd), x=client.data.x, y=client.data.y, public=rt.public,
                               targets=target, epochs=self.epochs, optimizer=rt.clients.optimizer, lam=self.lam,
                               seed=stage_seed(rt.seed, rnd, "joint", client.id), optimizer_key="clients.optimizer")


@dataclass(frozen=True)
class UnionFit(ClientStep):
    """Cross-entropy on D_i together with U labelled by the argmax of the target (FedCT's co-training).

    Uses ``clients.optimizer``. Only the argmax is read, so only it travels: class indices ``[n]`` (uint8 for
    M <= 256, else int16), as FedCT's bytes count them.
    """

    epochs: int
    stage: ClassVar[str] = "co-training"

    def task(self, rt: "ClientRuntime", client: Client, rnd: int, target: Optional[torch.Tensor]) -> Task:
        return fit_supervised, dict(self._common(rt, client, rnd), x=torch.cat([client.data.x, rt.public]),
                                    y=torch.cat([client.data.y, target.argmax(1)]), epochs=self.epochs,
                                    optimizer=rt.clients.optimizer, seed=stage_seed(rt.seed, rnd, "union", client.id),
                                    optimizer_key="clients.optimizer")

    def to_wire(self, target: Optional[torch.Tensor]) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
        config, _ = super().to_wire(None)
        m = target.shape[1]
        return {**config, "num_classes": m}, {"labels": target.argmax(1).to(torch.uint8 if m <= 256 else torch.int16)}

    @classmethod
    def from_wire(cls, config: dict[str, Any], arrays: dict[str, torch.Tensor]) -> tuple["ClientStep",
                                                                                          Optional[torch.Tensor]]:
        step, _ = super().from_wire(config, {})
        one_hot = torch.nn.functional.one_hot(arrays["labels"].long(), int(config["num_classes"])).float()
        return step, one_hot


@dataclass(frozen=True)
class Upload:
    """What each client sends to the server.

    ``kind``: ``"soft"`` pseudo-labels on U ``[n, M]`` (encoded per ``communication``), ``"hard"`` class indices
    on U ``[n]`` (1 byte each for M <= 256, else 2; the server sees them as one-hot rows), or ``"weights"``
    (the float tensors of the model's state dict; of a :class:`~cosmos_pl.models.personal.PersonalAndGlobal`, its
    copy of the global model, without the head when it is not shared:
    :func:`~cosmos_pl.models.personal.shared_weights`).
    """

    kind: Literal["soft", "hard", "weights"] = "soft"


@dataclass(frozen=True)
class LoadWeights:
    """Load the server's averaged weights into the client's model (FedAvg; into the copy of the global model for
    Ditto and FedBABU); the target is a state dict, keyed as :func:`~cosmos_pl.models.personal.shared_weights`."""


Step = Union[LocalFit, Upload, Distill, JointFit, UnionFit, LoadWeights, ProxFit, FineTune, StartGlobal]


def stage_of(step: ClientStep) -> str:
    """The stage name of a training step (``"client distillation"`` for :class:`Distill`, ...)."""
    return step.stage


def steps_to_wire(steps: list[tuple[ClientStep, Optional[torch.Tensor]]]
                  ) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """Training steps with their targets as ``(config, arrays)``: ``{"steps": k, "s0.step": "LocalFit", ...}`` and
    ``{"s1.target": ...}``, each step by its own :meth:`ClientStep.to_wire`."""
    config: dict[str, Any] = {"steps": len(steps)}
    arrays: dict[str, torch.Tensor] = {}
    for j, (step, target) in enumerate(steps):
        values, tensors = step.to_wire(target)
        config.update({f"s{j}.{k}": v for k, v in values.items()})
        arrays.update({f"s{j}.{k}": v for k, v in tensors.items()})
    return config, arrays


def steps_from_wire(config: dict[str, Any], arrays: dict[str, torch.Tensor]
                    ) -> list[tuple[ClientStep, Optional[torch.Tensor]]]:
    """The inverse of :func:`steps_to_wire` (no steps: ``[]``).

    Raises:
        ValueError: an unknown step name (a server and node of different cosmos-pl versions).
    """
    out = []
    for j in range(int(config.get("steps", 0))):
        prefix = f"s{j}."
        values = {k[len(prefix):]: v for k, v in config.items() if k.startswith(prefix)}
        tensors = {k[len(prefix):]: v for k, v in arrays.items() if k.startswith(prefix)}
        name = values.get("step")
        if name not in CLIENT_STEPS:
            raise ValueError(f"unknown client step {name!r} (known: {sorted(CLIENT_STEPS)}): the server and this node "
                             "run different cosmos-pl versions; install the same version on both")
        out.append(CLIENT_STEPS[name].from_wire(values, tensors))
    return out


# --------------------------------------------------------------------------- the runtime
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
        """The task training ``client.model`` for one step of round ``rnd`` (:meth:`ClientStep.task`)."""
        if not isinstance(step, ClientStep):
            raise TypeError(f"not a client training step: {step!r}")
        return step.task(self, client, rnd, target)

    def predict(self, client: Client, rnd: int) -> Task:
        """The task computing ``client``'s soft pseudo-labels on U, float32 ``[n, M]``."""
        return predict_probs, dict(model=client.model, x=self.public, trainer=self.trainer,
                                   where=f"round {rnd}, pseudo-labels on U, client {client.id}")

    def evaluate(self, client: Client, rnd: int, models: Optional[dict[str, nn.Module]] = None) -> list[tuple[str, Task]]:
        """``(split, task)`` per split the client has ("test", and "val" when there is a validation split); each
        task scores ``models`` (default: the client's own f_i as ``"client"``) on that split of the client's data
        and returns ``{name: {"top1": ..., "top5": ...}}`` (fractions; NaN on an empty split); a ``"teacher"`` is
        scored as ``"teacher_prior"`` too (:func:`~cosmos_pl.training.stages.evaluate_models`)."""
        models = {"client": client.model} if models is None else models
        d = client.data
        # a teacher is also scored shifted to the client's own label prior (from its own labels, on the client)
        prior = dict(class_counts=torch.bincount(d.y, minlength=self.num_classes), public=self.public) \
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

"""What every client step is: :class:`ClientStep` (its fields, its stage name, its seed's stage id, its task and its
wire encoding), the registry of steps a node can decode, and :class:`StepSettings`, what a step reads of the runtime.

A round is an ordered list of steps (an algorithm's :meth:`~cosmos_pl.algorithms.base.Algorithm.plan`). A training
objective is a :class:`ClientStep` subclass in its own module of :mod:`cosmos_pl.objectives`, which holds, beside the
step, its LightningModule and its loss; :meth:`ClientStep.task` names the function it runs, so the in-process workers
and the Flower nodes run it unchanged (:class:`~cosmos_pl.objectives.runtime.ClientRuntime`). Defining the class
registers it: its name in :data:`CLIENT_STEPS`, and its seed's stage id (``seed_stage`` and ``stage_id``) in
:data:`~cosmos_pl.training.config.STAGE_IDS`. This module imports no Lightning (a Flower node answering ``hello``
and the command line do not need it), and not the runtime either: a step reads it through :class:`StepSettings`.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Optional, Protocol

import torch

from cosmos_pl.training.config import register_stage, stage_seed

if TYPE_CHECKING:
    from cosmos_pl.training.client import Client, ClientConfig
    from cosmos_pl.training.config import TrainerConfig
    from cosmos_pl.transforms import Transformations

__all__ = ["CLIENT_STEPS", "ClientStep", "StepSettings", "Task"]

#: A task: a module-level function and its keyword arguments, run where the client's model is (an executor worker,
#: a Flower node); picklable by the function's name.
Task = tuple[Callable[..., Any], dict[str, Any]]

CLIENT_STEPS: dict[str, type["ClientStep"]] = {}  # class name -> class: what a node can decode


class StepSettings(Protocol):
    """What a step reads to build its task: the fields of :class:`~cosmos_pl.objectives.runtime.ClientRuntime`
    (the same on the server and on every node). ``public``: U, uint8 ``[n, C, H, W]``; ``num_classes``: M."""

    seed: int
    clients: "ClientConfig"
    transformations: "Transformations"
    trainer: "TrainerConfig"
    public: torch.Tensor
    num_classes: int


class ClientStep:
    """A training objective run on a client's own model (a frozen dataclass in each subclass).

    Subclasses set ``stage`` (its name in progress lines and errors) and implement :meth:`task`; :meth:`to_wire`
    sends the fields and the target as float32 ``[n, M]``, which a subclass may encode more compactly.
    ``needs_target``: the step trains on what the server sent this round, so it comes after the round's
    :class:`~cosmos_pl.objectives.protocol.Upload` and runs for the clients that got a target; a step without one
    (local training, Ditto's personal step) runs for every client taking part, wherever it is. ``seed_stage``: the
    stage whose id seeds the step (:func:`~cosmos_pl.training.config.stage_seed`); a class that sets ``stage_id``
    registers that new id for it when defined (ids are never reused: every seed stays as it is).
    ``optimizer_setting``: the :class:`~cosmos_pl.training.client.ClientConfig` optimizer it trains with.
    """

    stage: ClassVar[str] = ""
    needs_target: ClassVar[bool] = True
    seed_stage: ClassVar[str] = ""
    stage_id: ClassVar[Optional[int]] = None
    optimizer_setting: ClassVar[str] = "optimizer"

    def idle(self) -> bool:
        """Whether the step has nothing to do and is skipped (a step of 0 epochs)."""
        return getattr(self, "epochs", 1) <= 0

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Register the class by name, and its seed's stage id when it sets one.

        Raises:
            ValueError: another class already has this name (the same class defined again, as a reloaded module
                does, replaces it), or the stage name or id is taken
                (:func:`~cosmos_pl.training.config.register_stage`).
        """
        super().__init_subclass__(**kwargs)
        known = CLIENT_STEPS.get(cls.__name__)
        if known is not None and (known.__module__, known.__qualname__) != (cls.__module__, cls.__qualname__):
            raise ValueError(f"client step {cls.__name__!r} is defined twice: in {known.__module__} and "
                             f"{cls.__module__}; a step's class name is its name on the wire, so it must be unique")
        if "stage_id" in cls.__dict__:
            register_stage(cls.seed_stage, cls.stage_id)
        CLIENT_STEPS[cls.__name__] = cls

    def task(self, runtime: StepSettings, client: "Client", rnd: int, target: Optional[torch.Tensor]) -> Task:
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

    def stage_arguments(self, runtime: StepSettings, client: "Client", rnd: int) -> dict[str, Any]:
        """The keywords every training stage takes (:func:`~cosmos_pl.objectives.stage.run_stage`): the model, batch
        size, transformations, trainer settings, ``where`` (the stage in error messages), the optimizer named by
        ``optimizer_setting`` with its setting's name, and the seed of (experiment seed, ``rnd``, ``seed_stage``,
        client id)."""
        return dict(model=client.model, batch_size=runtime.clients.batch_size, transformations=runtime.transformations,
                    trainer=runtime.trainer, where=f"round {rnd}, {self.stage}, client {client.id}",
                    optimizer=getattr(runtime.clients, self.optimizer_setting),
                    optimizer_key=f"clients.{self.optimizer_setting}",
                    seed=stage_seed(runtime.seed, rnd, self.seed_stage, client.id))

"""What every client step is: :class:`ClientStep` (its fields, its stage name, its task and its wire encoding).

A round is an ordered list of steps (an algorithm's :meth:`~cosmos_pl.algorithms.base.Algorithm.plan`). A training
objective is a :class:`ClientStep` subclass in its own module of :mod:`cosmos_pl.objectives`, which holds, beside the
step, its LightningModule, its loss and its stage function; :meth:`ClientStep.task` names that function, so the
in-process workers and the Flower nodes run it unchanged (:class:`~cosmos_pl.objectives.runtime.ClientRuntime`).
This module imports no Lightning: a Flower node answering ``hello`` and the command line do not need it.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Optional

import torch

if TYPE_CHECKING:
    from cosmos_pl.objectives.runtime import ClientRuntime
    from cosmos_pl.training.client import Client

__all__ = ["CLIENT_STEPS", "ClientStep", "Task"]

#: A task: a module-level function and its keyword arguments, run where the client's model is (an executor worker,
#: a Flower node); picklable by the function's name.
Task = tuple[Callable[..., Any], dict[str, Any]]

CLIENT_STEPS: dict[str, type["ClientStep"]] = {}  # class name -> class: what a node can decode


class ClientStep:
    """A training objective run on a client's own model (a frozen dataclass in each subclass).

    Subclasses set ``stage`` and implement :meth:`task`; :meth:`to_wire` sends the fields and the target as float32
    ``[n, M]``, which a subclass may encode more compactly. ``needs_target``: the step trains on what the server
    sent this round, so it comes after the round's :class:`~cosmos_pl.objectives.protocol.Upload` and runs for the
    clients that got a target; a step without one (local training, Ditto's personal step) runs for every client
    taking part, wherever it is.
    """

    stage: ClassVar[str] = ""
    needs_target: ClassVar[bool] = True

    def idle(self) -> bool:
        """Whether the step has nothing to do and is skipped (a step of 0 epochs)."""
        return getattr(self, "epochs", 1) <= 0

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        CLIENT_STEPS[cls.__name__] = cls

    def task(self, runtime: "ClientRuntime", client: "Client", rnd: int, target: Optional[torch.Tensor]) -> Task:
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

    def stage_arguments(self, runtime: "ClientRuntime", client: "Client", rnd: int) -> dict[str, Any]:
        """The keywords every training stage takes: the model, batch size, transformations, trainer settings and
        ``where`` (the stage in error messages)."""
        return dict(model=client.model, batch_size=runtime.clients.batch_size, transformations=runtime.transformations,
                    trainer=runtime.trainer, where=f"round {rnd}, {self.stage}, client {client.id}")

"""What a task's arguments and its trained model become on their way between this process and a parallel worker.

Everything crosses the worker's pipe by value (:mod:`cosmos_pl.execution.pipe`). What stays the same for a whole run,
or for a stage, is sent once per worker, then by name:

- resident tensors (:meth:`Residents.add`: a client's data, U). Where ``/dev/shm`` holds them they are first moved
  into one shared-memory arena (:meth:`Residents.share`), so that every worker maps the same pages and each process
  holds one file descriptor for all of them; otherwise (the executor's choice) each worker gets its own copy
  through its pipe;
- model architectures: the first model of an architecture goes whole (:class:`Skeleton`) and both ends keep a
  :class:`~cosmos_pl.execution.pipe.Template` of it; later models of that architecture go as their tensors
  (:class:`Weights`) and are built from the template. A trained model comes back the same way when it kept the
  architecture it was sent with, else whole;
- within one stage, a model that several of its tasks read (a cluster's teacher, scored with each of its clients)
  goes to a worker once (:class:`ForStage`) and is kept there until the stage ends.

The architecture key holds what the tensors do not carry (class, backbone name, every parameter's and buffer's
name, shape, dtype, strides and ``requires_grad``, every module's train/eval flag), so a model built from a template
equals the one sent in everything a stage reads. Python attributes other than these are the template's: models of
one architecture must not differ in them.
"""

from __future__ import annotations

import hashlib
import itertools
from collections import Counter
from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch import nn

from cosmos_pl.execution.pipe import Template
from cosmos_pl.training.config import RESIDENT_ATTR

__all__ = ["RESIDENT_ATTR", "STAGE_PREFIX", "ForStage", "Held", "Keep", "Residents", "Skeleton", "Weights",
           "architecture", "built", "module_tensors", "pack", "repeated_models", "trained_reply", "unpack"]

_ALIGN = 64  # byte alignment of each tensor in the shared arena

#: Names of the models a worker keeps for one stage start with this (see :func:`pack`).
STAGE_PREFIX = "stage "


# ----------------------------------------------------------------------------------------------- residents
@dataclass(frozen=True)
class Keep:
    """A resident tensor sent whole: the worker keeps it under ``name``."""

    name: str
    tensor: torch.Tensor


@dataclass(frozen=True)
class Held:
    """A resident tensor, a model architecture or a stage's model the worker already has, by name."""

    name: str


class Residents:
    """The tensors registered as resident, by identity (the very tensor object, not an equal one)."""

    def __init__(self) -> None:
        self._by_id: dict[int, tuple[str, torch.Tensor]] = {}
        self._names: dict[str, torch.Tensor] = {}
        self._unshared: list[torch.Tensor] = []

    def add(self, name: str, tensor: torch.Tensor) -> None:
        """Register ``tensor`` under ``name`` and tag it (:data:`RESIDENT_ATTR`); registering it again is a no-op.

        Raises:
            ValueError: ``name`` already names another tensor."""
        if name in self._names:
            if self._names[name] is not tensor:
                raise ValueError(f"resident name {name!r} already names another tensor")
            return
        self._by_id[id(tensor)] = (name, tensor)
        self._names[name] = tensor
        self._unshared.append(tensor)
        setattr(tensor, RESIDENT_ATTR, name)

    def name_of(self, value: Any) -> Optional[str]:
        entry = self._by_id.get(id(value)) if isinstance(value, torch.Tensor) else None
        return entry[0] if entry is not None and entry[1] is value else None

    def nbytes(self) -> int:
        """Bytes of the registered tensors not yet in an arena, as :meth:`share` lays them out (each starts at a
        multiple of 64 bytes)."""
        return sum(_aligned(t.numel() * t.element_size()) for t in self._unshared)

    def share(self) -> int:
        """Move the registered tensors not yet shared into one new shared-memory arena: a single ``/dev/shm``
        segment, so one file descriptor per process however many tensors it holds. Each tensor keeps its identity,
        values, dtype and shape (now contiguous); the memory it had is freed unless something else holds it.
        Returns the arena's bytes (0 when nothing was new)."""
        size = self.nbytes()
        if size:
            arena = torch.empty(size, dtype=torch.uint8).share_memory_()
            storage, offset = arena.untyped_storage(), 0
            for t in self._unshared:
                nbytes = t.numel() * t.element_size()
                if nbytes:
                    arena[offset:offset + nbytes].copy_(t.detach().contiguous().reshape(-1).view(torch.uint8))
                with torch.no_grad():
                    t.set_(storage, offset // t.element_size(), t.shape, _contiguous_strides(t.shape))
                offset += _aligned(nbytes)
        self._unshared = []
        return size


def _aligned(nbytes: int) -> int:
    return -(-nbytes // _ALIGN) * _ALIGN


def _contiguous_strides(shape: torch.Size) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


# ----------------------------------------------------------------------------------------------- models
def architecture(model: nn.Module) -> str:
    """A key naming ``model``'s architecture and everything about it that its tensors do not carry."""
    h = hashlib.sha1(f"{type(model).__module__}.{type(model).__qualname__}|{getattr(model, 'backbone_name', '')}"
                     .encode())
    for name, t in itertools.chain(model.named_parameters(), model.named_buffers()):
        h.update(f"{name}|{tuple(t.shape)}|{t.dtype}|{t.stride()}|{t.requires_grad};".encode())
    h.update(bytes(m.training for m in model.modules()))
    return "model " + h.hexdigest()


def module_tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter and buffer of ``model`` by name (non-persistent buffers too, which a state dict leaves out)."""
    return dict(itertools.chain(model.named_parameters(), model.named_buffers()))


@dataclass(frozen=True)
class Skeleton:
    """A model sent whole; the receiver keeps a template of it under ``name`` (its :func:`architecture`)."""

    name: str
    model: nn.Module


@dataclass(frozen=True)
class Weights:
    """A model as its tensors' bytes (:meth:`~cosmos_pl.execution.pipe.Template.flatten`), for the template
    ``name`` the receiver has."""

    name: str
    flat: list[torch.Tensor]


@dataclass(frozen=True)
class ForStage:
    """A model several tasks of the stage read: the worker keeps it under ``name`` until the stage ends."""

    name: str
    value: Any


def pack(kwargs: dict[str, Any], residents: Residents, held: set[str], templates: dict[str, Template],
         stage: Optional[int] = None, repeated: frozenset[int] = frozenset(), *,
         trains: bool = False) -> tuple[dict[str, Any], list[str]]:
    """``kwargs`` as sent to a worker that has the names in ``held``; returns them and the names the worker will
    have once they arrive (add them to ``held`` after the message is sent).

    Args:
        templates: this process's templates by architecture (a model sent whole adds its own), for
            :func:`built`.
        stage: the executor's number for the running stage; with ``repeated`` (the ids of the models that several
            of its tasks read), such a model is kept by the worker for the stage (:class:`ForStage`).
        trains: the task trains ``kwargs["model"]``: that one is never kept for the stage."""
    new: list[str] = []

    def whole_or_weights(value: nn.Module) -> Any:
        name = architecture(value)
        if name in held or name in new:
            return Weights(name, templates[name].flatten(module_tensors(value)))
        new.append(name)
        if name not in templates:
            templates[name] = Template(value, module_tensors(value))
        return Skeleton(name, value)

    def model(value: Any, *, read_only: bool) -> Any:
        if not isinstance(value, nn.Module):
            return value
        if stage is None or not read_only or id(value) not in repeated:
            return whole_or_weights(value)
        name = f"{STAGE_PREFIX}{stage} {id(value)}"
        if name in held or name in new:
            return Held(name)
        new.append(name)
        return ForStage(name, whole_or_weights(value))

    out = {}
    for key, value in kwargs.items():
        name = residents.name_of(value)
        if name is not None:
            out[key] = Held(name) if name in held or name in new else Keep(name, value)
            if isinstance(out[key], Keep):
                new.append(name)
        elif key == "model":
            out[key] = model(value, read_only=not trains)
        elif key == "models" and isinstance(value, dict):
            out[key] = {k: model(v, read_only=True) for k, v in value.items()}
        else:
            out[key] = value
    return out, new


def repeated_models(tasks: list[tuple[Any, dict[str, Any]]], *, trains: bool) -> frozenset[int]:
    """The ids of the models that more than one of ``tasks`` reads (a ``model`` the tasks train does not count)."""
    counts: Counter = Counter()
    for _, kwargs in tasks:
        if not trains and isinstance(kwargs.get("model"), nn.Module):
            counts[id(kwargs["model"])] += 1
        models = kwargs.get("models")
        for value in models.values() if isinstance(models, dict) else ():
            if isinstance(value, nn.Module):
                counts[id(value)] += 1
    return frozenset(k for k, n in counts.items() if n > 1)


def unpack(kwargs: dict[str, Any], held: dict[str, Any]) -> tuple[dict[str, Any], Optional[str]]:
    """In the worker: the task's arguments, with what :func:`pack` sent by name taken from ``held`` (which keeps
    resident tensors, templates and the stage's models); returns them and the architecture ``kwargs["model"]`` was
    sent as (None when it is not a model). Every model is the worker's own: it came by value.

    Raises:
        KeyError: a name the worker was never sent (a bug in the sender)."""
    sent: dict[str, str] = {}

    def model(value: Any, key: str) -> Any:
        if isinstance(value, ForStage):
            held[value.name] = model(value.value, key)
            return held[value.name]
        if isinstance(value, Held):
            return held[value.name]
        if isinstance(value, Skeleton):
            held[value.name] = Template(value.model, module_tensors(value.model))
            sent[key] = value.name
            return value.model
        if isinstance(value, Weights):
            sent[key] = value.name
            return held[value.name].build(value.flat)
        return value

    out = {}
    for key, value in kwargs.items():
        if isinstance(value, Keep):
            setattr(value.tensor, RESIDENT_ATTR, value.name)
            held[value.name] = value.tensor
            out[key] = value.tensor
        elif key == "models" and isinstance(value, dict):
            out[key] = {k: model(v, f"models.{k}") for k, v in value.items()}
        else:
            out[key] = model(value, key)
    return out, sent.get("model")


def trained_reply(model: Any, sent: Optional[str], held: dict[str, Any]) -> Any:
    """In the worker: what goes back for the trained ``model`` that came as architecture ``sent`` (its template in
    ``held``): its tensors (:class:`Weights`) when it still has that architecture and is on the CPU, else the model
    whole."""
    if isinstance(model, nn.Module) and sent is not None and architecture(model) == sent:
        tensors = module_tensors(model)
        if all(t.device.type == "cpu" for t in tensors.values()):
            return Weights(sent, held[sent].flatten(tensors))
    return model


def built(reply: Any, templates: dict[str, Template]) -> Any:
    """In this process: the trained model from :func:`trained_reply`'s ``reply``."""
    return templates[reply.name].build(reply.flat) if isinstance(reply, Weights) else reply

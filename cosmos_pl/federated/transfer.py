"""What a task's arguments become on their way to a parallel worker, and back into arguments there.

Two kinds of argument are sent whole only once per worker, then by name:
- resident tensors (:meth:`Residents.add`: a client's data, U), which stay the same for the whole run; the worker
  keeps them, across stages and rounds;
- models (a ``model`` argument, or the values of a ``models`` dict): the first model of an architecture goes whole
  and the worker keeps a private copy of it as a skeleton; later models of that architecture go as their state dict,
  loaded into a fresh copy of the skeleton. Pickling a timm MobileNetV2 module took 55.6 ms here against 6.5 ms for
  its state dict, paid in the main process for every task it sends.

The architecture key holds what a state dict does not carry (class, backbone name, every parameter's and buffer's
name, shape, dtype, strides and ``requires_grad``, every module's train/eval flag), so a rebuilt model equals the one
sent in everything a stage reads.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from cosmos_pl.training.config import RESIDENT_ATTR

__all__ = ["RESIDENT_ATTR", "Residents", "architecture", "pack", "unpack"]


@dataclass(frozen=True)
class Keep:
    """A resident tensor sent whole: the worker keeps it under ``name``."""

    name: str
    tensor: torch.Tensor


@dataclass(frozen=True)
class Held:
    """A resident tensor or a model architecture the worker already has, by name."""

    name: str


@dataclass(frozen=True)
class Skeleton:
    """A model sent whole; the worker keeps a private copy under ``name`` (its :func:`architecture`)."""

    name: str
    model: nn.Module


@dataclass(frozen=True)
class Weights:
    """A model as its state dict, for the skeleton ``name`` the worker has."""

    name: str
    state: dict[str, torch.Tensor]


class Residents:
    """The tensors registered as resident, by identity (the very tensor object, not an equal one)."""

    def __init__(self) -> None:
        self._by_id: dict[int, tuple[str, torch.Tensor]] = {}
        self._names: dict[str, torch.Tensor] = {}

    def add(self, name: str, tensor: torch.Tensor) -> None:
        """Register ``tensor`` under ``name`` and tag it (:data:`RESIDENT_ATTR`).

        Raises:
            ValueError: ``name`` already names another tensor."""
        if name in self._names and self._names[name] is not tensor:
            raise ValueError(f"resident name {name!r} already names another tensor")
        self._by_id[id(tensor)] = (name, tensor)
        self._names[name] = tensor
        setattr(tensor, RESIDENT_ATTR, name)

    def name_of(self, value: Any) -> str | None:
        entry = self._by_id.get(id(value)) if isinstance(value, torch.Tensor) else None
        return entry[0] if entry is not None and entry[1] is value else None


def architecture(model: nn.Module) -> str:
    """A key naming ``model``'s architecture and everything about it that its state dict does not carry."""
    h = hashlib.sha1(f"{type(model).__module__}.{type(model).__qualname__}|{getattr(model, 'backbone_name', '')}"
                     .encode())
    for name, t in itertools.chain(model.named_parameters(), model.named_buffers()):
        h.update(f"{name}|{tuple(t.shape)}|{t.dtype}|{t.stride()}|{t.requires_grad};".encode())
    h.update(bytes(m.training for m in model.modules()))
    return "model " + h.hexdigest()


def pack(kwargs: dict[str, Any], residents: Residents, held: set[str]) -> tuple[dict[str, Any], list[str]]:
    """``kwargs`` as sent to a worker that has the names in ``held``; returns them and the names the worker will
    have once they arrive (add them to ``held`` after the message is sent)."""
    new: list[str] = []

    def model(value: Any) -> Any:
        if not isinstance(value, nn.Module):
            return value
        name = architecture(value)
        if name in held or name in new:
            return Weights(name, value.state_dict())
        new.append(name)
        return Skeleton(name, value)

    out = {}
    for key, value in kwargs.items():
        name = residents.name_of(value)
        if name is not None:
            out[key] = Held(name) if name in held or name in new else Keep(name, value)
            if isinstance(out[key], Keep):
                new.append(name)
        elif key == "model":
            out[key] = model(value)
        elif key == "models" and isinstance(value, dict):
            out[key] = {k: model(v) for k, v in value.items()}
        else:
            out[key] = value
    return out, new


def unpack(kwargs: dict[str, Any], held: dict[str, Any]) -> tuple[dict[str, Any], set[str]]:
    """In the worker: the task's arguments, with what :func:`pack` sent by name taken from ``held`` (which keeps
    what came whole); returns them and the argument keys whose model was rebuilt from a skeleton (a private copy,
    sharing no memory with the main process).

    Raises:
        KeyError: a name the worker was never sent (a bug in the sender)."""
    private: set[str] = set()

    def model(value: Any, key: str) -> Any:
        if isinstance(value, Skeleton):
            held[value.name] = copy.deepcopy(value.model)  # private: the received one shares the sender's memory
            return value.model
        if isinstance(value, Weights):
            rebuilt = copy.deepcopy(held[value.name])
            rebuilt.load_state_dict(value.state)
            private.add(key)
            return rebuilt
        return value

    out = {}
    for key, value in kwargs.items():
        if isinstance(value, Keep):
            setattr(value.tensor, RESIDENT_ATTR, value.name)
            held[value.name] = value.tensor
            out[key] = value.tensor
        elif isinstance(value, Held):
            out[key] = held[value.name]
        elif key == "models" and isinstance(value, dict):
            out[key] = {k: model(v, f"models.{k}") for k, v in value.items()}
        else:
            out[key] = model(value, key)
    return out, private

"""A message's client steps on the wire: each step with its target, encoded by its own class
(:meth:`~cosmos_pl.objectives.step.ClientStep.to_wire`), the same on every transport (the Flower transport wraps them
in its records). Decoding imports every objective module (:func:`~cosmos_pl.objectives.import_objectives`), each of
which registers its steps in :data:`~cosmos_pl.objectives.step.CLIENT_STEPS` when imported.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from cosmos_pl.objectives import import_objectives
from cosmos_pl.objectives.step import CLIENT_STEPS, ClientStep

__all__ = ["steps_from_wire", "steps_to_wire"]


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
    if int(config.get("steps", 0)):  # Lightning only where there are steps to train
        import_objectives()
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

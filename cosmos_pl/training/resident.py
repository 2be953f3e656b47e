"""This process's device copies of the resident tensors (a client's data, U).

The executor sends each resident tensor to a worker once and tags it (:data:`~cosmos_pl.training.config.RESIDENT_ATTR`,
:meth:`~cosmos_pl.execution.executor.Executor.keep_resident`); :func:`to_device` makes its GPU copy once per process
and device, and every later stage and round reads that copy instead of copying the data to the GPU again: the
training stages (:func:`~cosmos_pl.training.engine.on_device`) and the inference on U
(:func:`~cosmos_pl.training.inference.batched_logits`). No Lightning here: inference imports it.
"""

from __future__ import annotations

import weakref

import torch

from cosmos_pl.training.config import RESIDENT_ATTR

__all__ = ["to_device"]

# one copy per resident tensor and device, kept for the process's life; the weak reference checks that the copy is
# of this very tensor (a later run in the same process may register another tensor under the same name)
_DEVICE_COPIES: dict[tuple[str, str], tuple[weakref.ref, torch.Tensor]] = {}


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``t`` on ``device``; a resident tensor's copy is made once per process and device, then reused."""
    name = getattr(t, RESIDENT_ATTR, None)
    if name is None:
        return t.to(device)
    kept = _DEVICE_COPIES.get((name, str(device)))
    if kept is not None and kept[0]() is t:
        return kept[1]
    copy = t.to(device)
    _DEVICE_COPIES[(name, str(device))] = (weakref.ref(t), copy)
    return copy

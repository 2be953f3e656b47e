"""What crosses the wire between the ServerApp and a node, and how many bytes it takes.

Messages (Flower's Message API, one ``RecordDict`` each way):

=======================  ==========================================================  ==============================
message type             server -> node                                              node -> server
=======================  ==========================================================  ==============================
``query.hello``          the run's resolved config (YAML text), U's fingerprint      client id, last committed round,
                                                                                     model digest, U's fingerprint
``train.step``           round, the step (LocalFit, Distill, JointFit, UnionFit),    last epoch's losses
                         its target ``[n, M]`` float32 (not for LocalFit)
``query.pseudo_labels``  round, kind (soft/hard), dtype, top-k, U's fingerprint      the encoded pseudo-labels
``query.weights``        round (FedAvg only)                                         the float tensors of the model
``train.load_weights``   round, the averaged float tensors (FedAvg only)             -
``evaluate.scores``      round, whether the client failed the round (roll back)      top-1/top-5 per split, digest
=======================  ==========================================================  ==============================

Arrays travel as ``ArrayRecord`` (numpy's format, no pickle); settings as ``ConfigRecord``; numbers back as
``MetricRecord``. Byte counts: :func:`array_bytes` gives the arrays' own bytes (what ``summary.json`` counts) and
their serialized size (the same plus numpy's header per array).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import numpy as np
import torch
from flwr.app import Array, ArrayRecord

from cosmos_pl.algorithms.base import Distill, JointFit, LocalFit, Step, UnionFit
from cosmos_pl.communication import Payload

__all__ = ["HELLO", "STEP", "PSEUDO_LABELS", "WEIGHTS", "LOAD_WEIGHTS", "SCORES", "step_to_config", "config_to_step",
           "payload_to_record", "record_to_payload", "tensors_to_record", "record_to_tensors", "array_bytes"]

HELLO, STEP, PSEUDO_LABELS = "query.hello", "train.step", "query.pseudo_labels"
WEIGHTS, LOAD_WEIGHTS, SCORES = "query.weights", "train.load_weights", "evaluate.scores"

_STEPS = {cls.__name__: cls for cls in (LocalFit, Distill, JointFit, UnionFit)}


def step_to_config(step: Step) -> dict[str, Any]:
    """A training step as ConfigRecord values: ``{"step": "Distill", "step.epochs": 1, ...}``."""
    return {"step": type(step).__name__, **{f"step.{k}": v for k, v in dataclasses.asdict(step).items()}}


def config_to_step(config: dict[str, Any]) -> Step:
    """The inverse of :func:`step_to_config`.

    Raises:
        ValueError: an unknown step name (a server and node of different cosmos-pl versions).
    """
    name = config.get("step")
    if name not in _STEPS:
        raise ValueError(f"unknown client step {name!r} (known: {sorted(_STEPS)}): the server and this node run "
                         "different cosmos-pl versions; install the same version on both")
    return _STEPS[name](**{k[5:]: v for k, v in config.items() if k.startswith("step.")})


def tensors_to_record(tensors: dict[str, torch.Tensor]) -> ArrayRecord:
    """Named CPU tensors as an ArrayRecord (numpy format; no pickle)."""
    return ArrayRecord({k: Array(t.detach().cpu().contiguous().numpy()) for k, t in tensors.items()})


def record_to_tensors(record: ArrayRecord) -> dict[str, torch.Tensor]:
    """The inverse of :func:`tensors_to_record` (each tensor owns its memory)."""
    return {k: torch.from_numpy(np.array(a.numpy(), copy=True)) for k, a in record.items()}


def payload_to_record(payload: Payload) -> tuple[ArrayRecord, dict[str, Any]]:
    """An encoded upload as ``(arrays, config)``: ``values`` (and ``indices`` for top-k) as arrays; M, the dtype
    and U's fingerprint as config."""
    arrays = {"values": payload.values}
    if payload.indices is not None:
        arrays["indices"] = payload.indices
    return tensors_to_record(arrays), {"num_classes": payload.num_classes, "dtype": payload.dtype,
                                       "public_fingerprint": payload.public_fingerprint or ""}


def record_to_payload(arrays: ArrayRecord, config: dict[str, Any]) -> Payload:
    """The inverse of :func:`payload_to_record`; the result still goes through
    :func:`cosmos_pl.uploads.check_upload` like an in-process upload.

    Raises:
        KeyError: ``values`` or a config field is missing (the runner rejects the upload with this reason).
    """
    t = record_to_tensors(arrays)
    return Payload(t["values"], t.get("indices"), int(config["num_classes"]), str(config["dtype"]),
                   str(config["public_fingerprint"]) or None)


def array_bytes(record: Optional[ArrayRecord]) -> tuple[int, int]:
    """``(array bytes, serialized bytes)`` of an ArrayRecord: the decoded arrays' ``nbytes`` summed (what cosmos-pl's
    accounting counts), and the length of what Flower serialized (numpy's format: the same plus a header each)."""
    if record is None:
        return 0, 0
    own = sum(int(a.numpy().nbytes) for a in record.values())
    return own, sum(len(a.data) for a in record.values())

"""What crosses the wire between the ServerApp and a node, and how many bytes it takes.

Messages (Flower's Message API, one ``RecordDict`` each way):

=======================  ==========================================================  ==============================
message type             server -> node                                              node -> server
=======================  ==========================================================  ==============================
``query.hello``          the run's resolved config (YAML text), U's fingerprint      client id, last committed round,
                                                                                     model digest, U's fingerprint
``query.pseudo_labels``  round, kind (soft/hard), dtype, top-k, U's fingerprint      the encoded pseudo-labels
``query.weights``        round (FedAvg only)                                         the float tensors of the model
``train.load_weights``   round, the averaged float tensors (FedAvg only)             -
``evaluate.scores``      round, whether the client failed the round (roll back)      top-1/top-5 per split, digest
=======================  ==========================================================  ==============================

A client's training steps (LocalFit, Distill, JointFit, UnionFit, with the target ``[n, M]`` float32 the server sent
for it) need no reply of their own: they ride on the client's next message (:func:`steps_to_record`), which runs them
first and replies their last-epoch losses. A round is then two messages per client (e.g. COSMOS's IFFT: local fit +
pseudo-labels; distillation + scores), which matters where every message starts a ClientApp process (Flower 1.42).

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

__all__ = ["HELLO", "PSEUDO_LABELS", "WEIGHTS", "LOAD_WEIGHTS", "SCORES", "step_to_config", "config_to_step",
           "steps_to_record", "record_to_steps",
           "payload_to_record", "record_to_payload", "tensors_to_record", "record_to_tensors", "array_bytes"]

HELLO, PSEUDO_LABELS = "query.hello", "query.pseudo_labels"
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


def steps_to_record(steps: list[tuple[Step, Optional[torch.Tensor]]]) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """Training steps and their targets as ``(config, arrays)``: ``{"steps": k, "s0.step": "LocalFit", ...}`` and
    ``{"s1.target": [n, M] float32, ...}`` (a step without a target has no array; UnionFit's target travels as its
    argmax class indices ``[n]``, uint8 for M <= 256, else int16)."""
    config: dict[str, Any] = {"steps": len(steps)}
    arrays = {}
    for j, (step, target) in enumerate(steps):
        config.update({f"s{j}.{k}": v for k, v in step_to_config(step).items()})
        if target is None:
            continue
        if isinstance(step, UnionFit):  # co-training reads only the argmax: hard labels, as FedCT's bytes count them
            m = target.shape[1]
            arrays[f"s{j}.labels"] = target.argmax(1).to(torch.uint8 if m <= 256 else torch.int16)
            config[f"s{j}.num_classes"] = m
        else:
            arrays[f"s{j}.target"] = target.float()
    return config, arrays


def record_to_steps(config: dict[str, Any], arrays: dict[str, torch.Tensor]) -> list[tuple[Step, Optional[torch.Tensor]]]:
    """The inverse of :func:`steps_to_record` (no steps: ``[]``)."""
    out = []
    for j in range(int(config.get("steps", 0))):
        prefix = f"s{j}."
        fields = {k[len(prefix):]: v for k, v in config.items() if k.startswith(prefix)}
        m = fields.pop("num_classes", None)
        target = arrays.get(f"s{j}.target")
        if f"s{j}.labels" in arrays:  # hard labels back to one-hot rows [n, M]
            target = torch.nn.functional.one_hot(arrays[f"s{j}.labels"].long(), int(m)).float()
        out.append((config_to_step(fields), target))
    return out


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

"""What crosses the wire between the ServerApp and a node, and how many bytes it takes.

Messages (Flower's Message API, one ``RecordDict`` each way):

=======================  ==========================================================  ==============================
message type             server -> node                                              node -> server
=======================  ==========================================================  ==============================
``query.hello``          the run's mode (deployment or simulation), its resolved     client id, its backbone and
                         config (YAML text), U's fingerprint, run token, classes     sizes, last committed round,
                                                                                     model digest, U's fingerprint,
                                                                                     data mode (site/partition)
``query.public``         rows of U (uint8), their place and U's fingerprint: once,   whether U is complete
                         to a site that does not have U (counted as setup bytes)
``query.pseudo_labels``  round, kind (soft/hard), dtype, top-k, U's fingerprint      the encoded pseudo-labels
``query.weights``        round (the weight-sharing baselines: FedAvg, Ditto,          what its model shares
                         FedBABU, FedSelect, pFedCK, pFedHN)                         (``weights_to_send``)
``train.load_weights``   round, its target: the averaged float tensors, the cluster  -
                         mean update or the generated weights
``evaluate.scores``      round, whether the client failed the round (roll back),     top-1/top-5 per split and
                         whether to score, and the models to score besides its own   model, digest
                         (``eval.<name>``: the architecture's name and its float
                         tensors, e.g. COSMOS's cluster teacher h_pi(i))
=======================  ==========================================================  ==============================

A client's training steps (LocalFit, Distill, JointFit, UnionFit, ProxFit, FineTune, StartGlobal, SelectFit,
MutualFit, PFedHNFit, with the target the server sent for it, each encoded by its own class: :func:`cosmos_pl.objectives.wire.steps_to_wire`) need no reply
of their own: they ride on the client's next message, which runs them first and replies their last-epoch losses. A
round is then two messages per client (e.g. COSMOS's IFFT: local fit + pseudo-labels; distillation + scores), which
matters where every message starts a ClientApp process (Flower 1.42). The models sent to be scored are counted apart
from the protocol's bytes (``evaluation`` in traffic.csv and summary.json), so the protocol's bytes stay pseudo-labels
only. Every reply is checked by :mod:`cosmos_pl.flower.validate` before anything in it is used.

Arrays travel as ``ArrayRecord`` (numpy's format, no pickle); settings as ``ConfigRecord``; numbers back as
``MetricRecord``. Byte counts: :func:`array_bytes` gives the arrays' own bytes (what ``summary.json`` counts) and
their serialized size (the same plus numpy's header per array).
"""

from __future__ import annotations

import re
from typing import Any, Optional

import numpy as np
import torch
from flwr.app import Array, ArrayRecord

from cosmos_pl.communication import Payload

__all__ = ["HEX", "HELLO", "PUBLIC", "PSEUDO_LABELS", "WEIGHTS", "LOAD_WEIGHTS", "SCORES", "array_bytes",
           "check_declared", "pack_scores", "payload_to_record", "record_to_payload", "record_to_tensors", "tensors_to_record"]

HELLO, PUBLIC, PSEUDO_LABELS = "query.hello", "query.public", "query.pseudo_labels"
#: A run token, U's fingerprint, a model digest or a node's token on the wire: lowercase hex, 1 to 64 digits (safe as
#: a part of a path on a node).
HEX = re.compile(r"[0-9a-f]{1,64}")
WEIGHTS, LOAD_WEIGHTS, SCORES = "query.weights", "train.load_weights", "evaluate.scores"


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


def check_declared(record: ArrayRecord, expected: dict[str, tuple[tuple[int, ...], str]]) -> None:
    """Refuse arrays other than ``expected`` (``{name: (shape, numpy dtype)}``) before any is decoded: the names,
    each array's declared shape and dtype, and its serialized size (at most the declared bytes plus numpy's
    header), so that a node cannot make the server allocate more than an honest upload takes.

    Raises:
        ValueError: naming the array and what differs.
    """
    if sorted(record) != sorted(expected):
        raise ValueError(f"arrays {sorted(record)}, expected {sorted(expected)}")
    for name, (shape, dtype) in expected.items():
        a = record[name]
        if tuple(a.shape) != tuple(shape) or str(a.dtype) != dtype:
            raise ValueError(f"array {name} declared {a.dtype} {list(a.shape)}, expected {dtype} {list(shape)}")
        limit = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize + 4096
        if len(a.data) > limit:
            raise ValueError(f"array {name} holds {len(a.data)} bytes, more than {dtype} {list(shape)} needs")


def pack_scores(per_split: dict[str, dict[str, dict[str, float]]]) -> dict[str, float]:
    """``{split: {model: {metric: value}}}`` as the flat ``{"split.model.metric": value}`` of a ``MetricRecord``."""
    return {f"{split}.{name}.{metric}": float(value) for split, named in per_split.items()
            for name, metrics in named.items() for metric, value in metrics.items()}

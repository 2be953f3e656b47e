"""What the server accepts of the clients' uploads: every upload checked before anything is aggregated.

Pseudo-labels go through :func:`cosmos_pl.uploads.check_upload` (shape, dtype, finite, simplex rows, U's
fingerprint) and are decoded; weights (FedAvg) through :func:`cosmos_pl.uploads.check_weights` against the server's
own copy of the client's architecture. A client whose upload fails a check is failed for the round, with the check's
reason, and its upload is dropped.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from cosmos_pl.communication import decode, state_dict_bytes
from cosmos_pl.execution.task_failure import TaskFailure
from cosmos_pl.uploads import RejectedUpload, UploadSpec, check_upload, check_weights

__all__ = ["accept_uploads"]


def accept_uploads(rnd: int, kind: str, got: dict[int, Any], spec: UploadSpec,
                   reference: Callable[[int], dict[str, torch.Tensor]], fail: Callable[[int, int, str, str], None],
                   weight_bytes: Callable[[int, dict[str, torch.Tensor]], int] = lambda i, s: state_dict_bytes(s)
                   ) -> tuple[dict[int, Any], int]:
    """``({client: decoded [n, M] or state dict}, bytes of one accepted upload)`` from what the clients sent.

    Args:
        got: ``{client: Payload, state dict or TaskFailure}``.
        spec: what a pseudo-label upload must be (``kind`` soft or hard).
        reference: ``client -> the float tensors its weights must match`` (FedAvg).
        fail: ``(round, client, step, reason)``, called for each client refused.
        weight_bytes: ``(client, state) -> bytes`` of one weights upload as the algorithm sends it
            (:meth:`~cosmos_pl.algorithms.base.Algorithm.upload_bytes`; default: every float tensor).
    """
    received = {}
    for i, item in got.items():
        if isinstance(item, TaskFailure):
            fail(rnd, i, item.step or "upload", item.reason)
        else:
            received[i] = item
    if kind == "weights":
        valid = {}
        for i, state in received.items():
            try:
                check_weights(state, reference(i))
                valid[i] = state
            except RejectedUpload as err:
                fail(rnd, i, "upload", f"rejected: {err}")
        return valid, max((weight_bytes(i, s) for i, s in valid.items()), default=0)
    decoded, sizes = {}, []
    for i, payload in received.items():
        try:
            check_upload(payload, spec)
        except RejectedUpload as err:
            fail(rnd, i, "upload", f"rejected: {err}")
            continue
        sizes.append(payload.nbytes)  # what one accepted upload costs
        decoded[i] = decode(payload)
    return decoded, max(sizes, default=0)

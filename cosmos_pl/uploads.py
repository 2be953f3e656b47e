"""Checks on every upload before the server uses it: the one gate between clients and aggregation.

A client that crashed half-way, diverged, predicted on the wrong public set or sends garbage must never reach a
teacher, a cluster mean or a consensus. :func:`check_upload` looks at the payload as it arrived (before decoding):
shape ``[n, M]`` (``[n, k]`` values and indices for top-k, ``[n]`` for hard labels), dtype, finite values,
non-negative values, rows summing to 1 within :func:`row_sum_tolerance`, class indices in range, and the public-set
fingerprint the client computed on the U it predicted on. A rejected upload raises :class:`RejectedUpload` with
the reason; the runner records it and leaves the client out of that round. The multi-machine transport calls the
same function on what it receives.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Optional

import torch

from cosmos_pl.communication import Payload

__all__ = ["RejectedUpload", "UploadSpec", "public_fingerprint", "row_sum_tolerance", "check_upload", "check_weights"]

_VALUE_DTYPES = {"float32": (torch.float32,), "float16": (torch.float16,), "uint8": (torch.uint8,),
                 "index": (torch.uint8, torch.int16)}


class RejectedUpload(ValueError):
    """An upload failed a check; the message says which and why (shape, dtype, value or fingerprint)."""


def public_fingerprint(public: torch.Tensor) -> str:
    """The first 16 hex digits of SHA-256 over U's shape, dtype and bytes ``[n, C, H, W]``: the same public set in
    the same order gives the same fingerprint on every machine."""
    t = public.detach().cpu().contiguous()
    h = hashlib.sha256(f"{tuple(t.shape)}|{t.dtype}|".encode())
    h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()[:16]


def row_sum_tolerance(dtype: str, num_classes: int, top_k: Optional[int] = None) -> float:
    """How far a row of an honest upload may sum from 1: 1e-3 for float32 and float16 (float16 rounds each
    probability to 2^-11 of itself, so a row's sum moves by at most 5e-4); for uint8 each of the k sent values
    moves by at most 0.5/255, so ``k / 510 + 1e-3``. Top-k rows sum to at most 1 plus this tolerance."""
    sent = num_classes if top_k is None else top_k
    return sent / 510 + 1e-3 if dtype == "uint8" else 1e-3


@dataclass(frozen=True)
class UploadSpec:
    """What the server expects from every client this round.

    Attributes:
        public_samples: n = |U|.
        num_classes: M.
        dtype: the configured ``communication.upload_dtype`` ("float32", "float16", "uint8"), or "index" for hard labels.
        top_k: the configured ``communication.top_k`` (None: dense).
        fingerprint: :func:`public_fingerprint` of the server's U.
    """

    public_samples: int
    num_classes: int
    dtype: str
    top_k: Optional[int]
    fingerprint: str


def _reject(reason: str) -> None:
    raise RejectedUpload(reason)


def check_upload(payload: Any, spec: UploadSpec) -> None:
    """Check one upload against ``spec``; returns None when it may be aggregated.

    Raises:
        RejectedUpload: the first check that fails, e.g. ``"shape [1999, 10], expected [2000, 10]"``,
            ``"12 values are NaN or inf"``, ``"3 rows sum to 1.5 (max |sum - 1| 0.5 > tolerance 0.001)"``,
            ``"public-set fingerprint 00ff.. does not match the server's 3a7c.."``.
    """
    if not isinstance(payload, Payload):
        _reject(f"not a pseudo-label payload ({type(payload).__name__})")
    if payload.public_fingerprint != spec.fingerprint:
        _reject(f"public-set fingerprint {payload.public_fingerprint} does not match the server's {spec.fingerprint}: "
                "the client predicted on another U (other data, order or preprocessing)")
    if payload.num_classes != spec.num_classes or payload.dtype != spec.dtype:
        _reject(f"declared M = {payload.num_classes}, dtype {payload.dtype}; expected M = {spec.num_classes}, "
                f"dtype {spec.dtype}")
    values, n, m = payload.values, spec.public_samples, spec.num_classes
    if not isinstance(values, torch.Tensor):
        _reject(f"values are a {type(values).__name__}, not a tensor")
    if values.dtype not in _VALUE_DTYPES[spec.dtype]:
        _reject(f"values have dtype {values.dtype}, expected {' or '.join(map(str, _VALUE_DTYPES[spec.dtype]))}")
    sparse = spec.dtype != "index" and spec.top_k is not None and spec.top_k < m
    width = spec.top_k if sparse else m
    expected = [n] if spec.dtype == "index" else [n, width]
    if list(values.shape) != expected:
        _reject(f"shape {list(values.shape)}, expected {expected}")
    if spec.dtype == "index":
        if bool(((values.long() < 0) | (values.long() >= m)).any()):
            _reject(f"class indices outside [0, {m})")
        return
    if sparse:
        idx = payload.indices
        if not isinstance(idx, torch.Tensor) or list(idx.shape) != expected or idx.is_floating_point():
            _reject(f"top-k class indices missing or of shape {None if idx is None else list(idx.shape)}, "
                    f"expected integer {expected}")
        if bool(((idx.long() < 0) | (idx.long() >= m)).any()):
            _reject(f"top-k class indices outside [0, {m})")
    elif payload.indices is not None:
        _reject("dense upload carries class indices")
    v = values.float()
    bad = int((~torch.isfinite(v)).sum())
    if bad:
        _reject(f"{bad} values are NaN or inf")
    negative = int((v < 0).sum())
    if negative:
        _reject(f"{negative} values are negative (min {float(v.min()):.4g})")
    sums = v.sum(dim=1) / (255 if spec.dtype == "uint8" else 1)
    tol = row_sum_tolerance(spec.dtype, m, spec.top_k if sparse else None)
    off = (sums - 1).abs() if not sparse else (sums - 1).clamp_min(0)
    worst = float(off.max()) if len(off) else 0.0
    if worst > tol:
        rows = int((off > tol).sum())
        _reject(f"{rows} rows do not sum to 1 (max |sum - 1| {worst:.4g} > tolerance {tol:.4g})")


def check_weights(state: Any, reference: dict[str, torch.Tensor]) -> None:
    """Check a weights upload (FedAvg) against the server model's state dict: the same keys and shapes, finite
    values, and uint8 tensors (FedSelect's masks) holding only 0 and 1.

    Raises:
        RejectedUpload: a missing or extra key, a shape, or non-finite values (naming the tensor).
    """
    if not isinstance(state, dict):
        _reject(f"not a state dict ({type(state).__name__})")
    missing, extra = sorted(set(reference) - set(state)), sorted(set(state) - set(reference))
    if missing or extra:
        _reject(f"state dict keys differ: missing {missing[:3]}, unexpected {extra[:3]}")
    for key, ref in reference.items():
        t = state[key]
        if not isinstance(t, torch.Tensor) or t.shape != ref.shape:
            _reject(f"{key}: shape {getattr(t, 'shape', None)}, expected {tuple(ref.shape)}")
        if not bool(torch.isfinite(t).all()):
            _reject(f"{key}: NaN or inf values")
        if ref.dtype == torch.uint8 and (t.dtype != torch.uint8 or bool((t > 1).any())):  # a mask (FedSelect)
            _reject(f"{key}: a mask must be uint8 0/1, got {t.dtype} with max {t.max().item() if t.numel() else 0}")

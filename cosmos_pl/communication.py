"""What COSMOS sends, and its exact size: pseudo-labels on the public set U, both ways.

A client uploads its ``[n, M]`` pseudo-labels once per round and downloads its cluster teacher's. Uploads
can be made smaller (``upload_dtype``, ``top_k``); the server decodes them back to rows on the simplex.
Byte counts are the sizes of the tensors actually sent (COSMOS paper, Appendix C Table 4 counts bandwidth
per client).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Optional

import torch

from cosmos_pl.errors import ConfigError, DivergenceError, check

__all__ = ["CommunicationConfig", "pseudo_label_bytes", "hard_label_bytes", "state_dict_bytes", "Payload", "encode",
           "encode_hard", "decode", "UploadDtype"]

UploadDtype = Literal["float32", "float16", "uint8"]
_ITEM_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "uint8": 1}
_TORCH = {"float32": torch.float32, "float16": torch.float16, "uint8": torch.uint8}


@dataclass
class CommunicationConfig:
    """How clients' soft pseudo-label uploads are encoded; bytes are counted exactly (summary.json, metrics.csv).

    Args:
        upload_dtype: float32 (default), float16, or uint8 (each probability quantized to round(255 p), renormalized on arrival).
        top_k: send only the k largest probabilities per public sample with their class indices; the dropped mass is spread evenly over the other classes on arrival. null sends all M.
    """

    upload_dtype: UploadDtype = "float32"
    top_k: Optional[int] = None

    def __post_init__(self) -> None:
        """Raises ConfigError for an unknown dtype or k < 1 (k <= M is checked once the data set is loaded)."""
        check(self.upload_dtype in _TORCH, "communication.upload_dtype", self.upload_dtype,
              "use float32, float16 or uint8")
        check(self.top_k is None or self.top_k >= 1, "communication.top_k", self.top_k,
              "must be >= 1 (at most M, the number of classes), or null for dense uploads")


def _index_bytes(num_classes: int) -> int:
    return 1 if num_classes <= 256 else 2


def hard_label_bytes(n: int, num_classes: int) -> int:
    """Bytes of ``n`` class indices as sent: 1 byte each for M <= 256, else 2."""
    return n * _index_bytes(num_classes)


def state_dict_bytes(state: dict[str, Any]) -> int:
    """Bytes of the floating-point tensors of a model's state dict (what FedAvg sends each way)."""
    return sum(t.numel() * t.element_size() for t in state.values()
               if isinstance(t, torch.Tensor) and t.is_floating_point())


def pseudo_label_bytes(n: int, num_classes: int, dtype: str = "float32", top_k: Optional[int] = None) -> int:
    """Bytes of one ``[n, M]`` pseudo-label matrix as sent.

    Dense: ``n * M * itemsize``. With ``top_k = k``: ``n * k * (itemsize + index_bytes)`` where the class
    index takes 1 byte for M <= 256, else 2 (the dropped mass is implied by 1 - sum, so nothing else travels).

    Raises:
        ConfigError: an unknown dtype or k outside [1, M] (settings). ValueError: negative sizes (a bug).
    """
    if dtype not in _ITEM_BYTES:
        raise ConfigError(f"communication.upload_dtype={dtype!r}: use one of {sorted(_ITEM_BYTES)}")
    if n < 0 or num_classes < 0:
        raise ValueError(f"sizes must be >= 0, got n={n}, M={num_classes}")
    if top_k is None:
        return n * num_classes * _ITEM_BYTES[dtype]
    if not 1 <= top_k <= num_classes:
        raise ConfigError(f"communication.top_k={top_k}: must lie in [1, M={num_classes}] (or null for dense)")
    return n * top_k * (_ITEM_BYTES[dtype] + _index_bytes(num_classes))


@dataclass
class Payload:
    """An encoded ``[n, M]`` pseudo-label matrix: ``values`` ``[n, M]`` or ``[n, k]``, ``indices`` ``[n, k]`` or None;
    ``public_fingerprint``: :func:`cosmos_pl.uploads.public_fingerprint` of the U the client predicted on (16 hex
    digits, not counted in :attr:`nbytes`: it identifies the round's request, like a header)."""

    values: torch.Tensor
    indices: Optional[torch.Tensor]
    num_classes: int
    dtype: str
    public_fingerprint: Optional[str] = None

    @property
    def nbytes(self) -> int:
        """Bytes on the wire: the element sizes of the tensors sent."""
        total = self.values.numel() * self.values.element_size()
        if self.indices is not None:
            total += self.indices.numel() * self.indices.element_size()
        return total


def _check_finite(values: torch.Tensor, purpose: str) -> None:
    """Raise :class:`DivergenceError` when pseudo-labels ``[n, M]`` (or ``[n, k]``) hold a NaN or an infinity."""
    if values.is_floating_point():
        finite = torch.isfinite(values)
        rows = ~(finite.flatten(1).all(dim=1) if finite.dim() > 1 else finite)
        if bool(rows.any()):
            kind = "nan" if bool(torch.isnan(values).any()) else "inf"
            raise DivergenceError(
                f"pseudo-labels {purpose} [{', '.join(map(str, values.shape))}] are non-finite ({kind}) in "
                f"{int(rows.sum())} of {len(values)} rows: the model that produced them diverged; lower the "
                f"learning rates that trained it (clients.optimizer, clients.distill_optimizer)")


def encode(probs: torch.Tensor, dtype: UploadDtype = "float32", top_k: Optional[int] = None,
           fingerprint: Optional[str] = None) -> Payload:
    """Encode pseudo-labels ``[n, M]`` for upload.

    ``float16`` casts; ``uint8`` quantizes each probability to ``round(255 p)``; ``top_k`` keeps the k largest
    probabilities per row with their class indices (uint8 for M <= 256, else int16).

    Raises:
        ConfigError: unknown dtype or k outside [1, M].
        DivergenceError: ``probs`` holds a NaN or an infinity (the model that produced them diverged).
    """
    if dtype not in _TORCH:
        raise ConfigError(f"communication.upload_dtype={dtype!r}: use float32, float16 or uint8")
    n, m = probs.shape
    pseudo_label_bytes(n, m, dtype, top_k)  # validates
    _check_finite(probs, "to encode")
    p = probs.float()
    indices = None
    if top_k is not None and top_k < m:
        p, idx = p.topk(top_k, dim=1)
        indices = idx.to(torch.uint8 if _index_bytes(m) == 1 else torch.int16)
    values = (p * 255).round().to(torch.uint8) if dtype == "uint8" else p.to(_TORCH[dtype])
    return Payload(values, indices, m, dtype, fingerprint)


def encode_hard(probs: torch.Tensor, fingerprint: Optional[str] = None) -> Payload:
    """Hard labels: the argmax class of each row of ``[n, M]``, as uint8 (M <= 256) or int16 indices ``[n]``.

    Raises:
        DivergenceError: ``probs`` holds a NaN or an infinity (its argmax would be meaningless).
    """
    _check_finite(probs, "to encode")
    m = probs.shape[1]
    labels = probs.argmax(dim=1).to(torch.uint8 if _index_bytes(m) == 1 else torch.int16)
    return Payload(labels, None, m, "index", fingerprint)


def decode(payload: Payload) -> torch.Tensor:
    """Back to float32 ``[n, M]`` rows on the simplex (hard labels become one-hot rows).

    Top-k rows: the kept probabilities are placed at their classes and the dropped mass ``1 - sum(kept)``
    is spread evenly over the other M - k classes (for k = M nothing is dropped). Every row is then divided
    by its sum; a finite row that decodes to all zeros (possible with uint8) becomes uniform.

    Raises:
        DivergenceError: the payload holds a NaN or an infinity: it is never turned into uniform rows, which
            would hide a diverged client (every distance 0, one cluster, chance accuracy).
    """
    if payload.dtype == "index":
        return torch.nn.functional.one_hot(payload.values.long(), payload.num_classes).float()
    _check_finite(payload.values, "to decode")
    values = payload.values.float()
    if payload.dtype == "uint8":
        values = values / 255
    if payload.indices is None:
        out = values
    else:
        n, k = values.shape
        m = payload.num_classes
        rest = (1 - values.sum(dim=1, keepdim=True)).clamp_min(0) / max(m - k, 1)
        out = rest.expand(n, m).clone()
        out.scatter_(1, payload.indices.long(), values)
    sums = out.sum(dim=1, keepdim=True)
    uniform = torch.full_like(out, 1.0 / out.shape[1])
    return torch.where(sums > 0, out / sums.clamp_min(1e-12), uniform)

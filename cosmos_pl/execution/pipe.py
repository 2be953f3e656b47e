"""How an object crosses a parallel worker's pipe: by value, with each CPU tensor's bytes as a frame of its own.

:func:`send` pickles a message with pickle protocol 5 and sends each CPU tensor's bytes out of band, straight from
the tensor's memory; :func:`receive` reads each frame into memory the rebuilt tensor then owns. No file descriptor
or shared-memory file stays behind for what crossed: torch's own sharing between processes (a shared-memory file per
tensor, held open by every process holding the tensor) runs parallel runs out of descriptors under the common
limit of 1,024 (a MobileNetV2 has 314 tensors), and is slow per model round trip (docs/performance.md, "Choices in
the code"). Strides are kept
(channels-last weights stay channels-last), and so are ``requires_grad``, ``nn.Parameter`` and attributes set on a
tensor. A tensor already in shared memory (the executor's resident arena) goes torch's way: one descriptor for the
whole arena.

:class:`Template` rebuilds a model of a known architecture from new tensors by unpickling, which is much faster than
a deep copy of a module tree (docs/performance.md).
"""

from __future__ import annotations

import io
import os
import pickle
import struct
from multiprocessing.connection import Connection
from multiprocessing.reduction import ForkingPickler
from typing import Any, Optional, Union

import torch
import torch.multiprocessing  # noqa: F401  (registers torch's shared-memory pickling, which the arena travels by)
from torch import nn

__all__ = ["Template", "receive", "send"]


def _dense(t: torch.Tensor) -> bool:
    """``t``'s elements fill a contiguous span of its storage exactly once (contiguous, channels-last, transposed)."""
    expected = 1
    for size, stride in sorted(((s, st) for s, st in zip(t.shape, t.stride()) if s != 1), key=lambda p: p[1]):
        if stride != expected:
            return False
        expected *= size
    return True


def _span(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``t`` as sent (itself when dense, else a contiguous copy) and its memory span as a 1-D uint8 tensor (a view,
    not a copy)."""
    data = t.detach()
    if not _dense(data):
        data = data.contiguous()
    n = data.numel()
    if n == 0:
        return data, torch.empty(0, dtype=torch.uint8)
    return data, data.as_strided((n,), (1,), data.storage_offset()).view(torch.uint8)


def _rebuild_tensor(buffer: Any, cls: type, dtype: torch.dtype, shape: tuple[int, ...], stride: tuple[int, ...],
                    requires_grad: bool, state: Optional[dict[str, Any]]) -> torch.Tensor:
    if len(buffer) == 0:
        t = torch.empty_strided(shape, stride, dtype=dtype)
    else:
        t = torch.frombuffer(buffer, dtype=torch.uint8).view(dtype).as_strided(shape, stride)
    if cls is nn.Parameter:
        t = nn.Parameter(t, requires_grad=requires_grad)
    elif requires_grad:
        t.requires_grad_(True)
    if state:
        t.__dict__.update(state)
    return t


class _Pickler(ForkingPickler):
    """Pickles a CPU tensor's bytes out of band (one frame each); a tensor in shared memory and anything else this
    does not handle (CUDA, sparse, quantized) go torch's and pickle's usual ways."""

    def reducer_override(self, obj: Any) -> Any:
        if type(obj) not in (torch.Tensor, nn.Parameter):
            return NotImplemented
        if (obj.device.type != "cpu" or obj.layout != torch.strided or obj.is_quantized or obj.is_conj()
                or obj.is_neg() or obj.is_shared() or (obj.requires_grad and not obj.is_leaf)):
            return NotImplemented
        data, raw = _span(obj)
        self.tensor_sent(obj, raw)
        return _rebuild_tensor, (pickle.PickleBuffer(raw.numpy() if len(raw) else b""), type(obj), obj.dtype, tuple(data.shape),
                                 tuple(data.stride()), obj.requires_grad, dict(obj.__dict__) or None)

    def tensor_sent(self, obj: torch.Tensor, raw: torch.Tensor) -> None:
        """Called for each tensor whose bytes (``raw``) go out of band, in frame order."""


def _dump(obj: Any, pickler: type = _Pickler) -> tuple[bytes, list[pickle.PickleBuffer]]:
    frames: list[pickle.PickleBuffer] = []
    out = io.BytesIO()
    pickler(out, 5, True, frames.append).dump(obj)  # ForkingPickler takes its arguments by position only
    return out.getvalue(), frames


def send(conn: Connection, obj: Any) -> None:
    """Send ``obj`` over ``conn``: a frame with the pickle (and the number of tensor frames), then each CPU tensor's
    bytes as a frame of its own, written from the tensor's memory (read back by :func:`receive`).

    Raises:
        BrokenPipeError, OSError: the other end is gone.
    """
    head, frames = _dump(obj)
    conn.send_bytes(struct.pack("<I", len(frames)) + head)
    for frame in frames:
        conn.send_bytes(frame.raw())


def _read_into(fd: int, view: memoryview) -> None:
    got = 0
    while got < len(view):
        n = os.readv(fd, [view[got:]])
        if n == 0:
            raise EOFError
        got += n


def _frame(conn: Connection, aligned: bool = True) -> Any:
    """One frame as ``Connection.send_bytes`` writes it (a 4-byte big-endian length, or -1 then 8 bytes for a frame
    of 2 GiB or more), read straight into the memory that keeps it (``Connection.recv_bytes`` copies it twice more).

    ``aligned``: into a tensor's memory (torch aligns it to 64 bytes, as it does every tensor it allocates), not a
    bytearray's (16): some CPU kernels (MKL's among them) sum in another order at another alignment, and a model
    that crossed a pipe would then train to other digits than one that did not."""
    fd = conn.fileno()
    head = bytearray(4)
    _read_into(fd, memoryview(head))
    (size,) = struct.unpack("!i", head)
    if size == -1:
        head = bytearray(8)
        _read_into(fd, memoryview(head))
        (size,) = struct.unpack("!Q", head)
    buffer = torch.empty(size, dtype=torch.uint8).numpy() if aligned else bytearray(size)
    _read_into(fd, memoryview(buffer))
    return buffer


def receive(conn: Connection) -> Any:
    """The object :func:`send` sent; each tensor owns the memory its bytes were read into.

    Raises:
        EOFError: the other end closed the pipe.
    """
    head = _frame(conn, aligned=False)
    (count,) = struct.unpack_from("<I", head)
    buffers = [_frame(conn) for _ in range(count)]
    return pickle.loads(memoryview(head)[4:], buffers=buffers)


class Template:
    """A model's pickle with its tensors left out: models of the same architecture travel as their tensors' bytes
    (:meth:`flatten`: the small tensors in one frame, each large one in its own) and are rebuilt by unpickling
    (:meth:`build`); everything but the tensors (flags, attributes) is ``model``'s.

    Args:
        model: the model whose structure later models share.
        tensors: its tensors by name (every parameter and buffer); a tensor the model holds outside them is a
            constant, copied into each model built.
    """

    LARGE = 2 ** 16  # bytes from which a tensor is a frame of its own
    ALIGN = 64  # bytes: where each small tensor starts in the shared buffer

    def __init__(self, model: nn.Module, tensors: dict[str, torch.Tensor]) -> None:
        names = {id(t): name for name, t in tensors.items()}
        order: list[Union[str, bytes]] = []  # per frame: a tensor's name, or a constant's bytes
        sizes: dict[str, tuple[int, int]] = {}  # name: (element size, bytes)

        class Recording(_Pickler):
            def tensor_sent(self, obj: torch.Tensor, raw: torch.Tensor) -> None:
                if id(obj) in names:
                    order.append(names[id(obj)])
                    sizes[names[id(obj)]] = (obj.element_size(), len(raw))
                else:
                    order.append(bytes(raw.numpy()))

        self.pickle, _ = _dump(model, Recording)
        self.order = order
        # small tensors share one buffer, each at a multiple of 64 bytes (see _frame: the alignment torch gives every
        # tensor it allocates); a large one is its own frame, sent from its memory (copying it into the buffer cost
        # more)
        small = [n for n in sizes if sizes[n][1] < self.LARGE]
        self.large = [n for n in sizes if sizes[n][1] >= self.LARGE]
        self.small, self.offsets, offset = small, {}, 0
        for name in small:
            self.offsets[name] = (offset, sizes[name][1])
            offset += -(-sizes[name][1] // self.ALIGN) * self.ALIGN
        self.small_bytes = offset

    def flatten(self, tensors: dict[str, torch.Tensor]) -> list[torch.Tensor]:
        """A model's ``tensors`` (by name, with the template's shapes, dtypes and strides) as uint8 tensors: the
        bytes of the small ones in one buffer, then the memory of each large one (a view, not a copy).

        Raises:
            KeyError: a parameter or buffer missing from ``tensors``."""
        small = torch.zeros(self.small_bytes, dtype=torch.uint8)
        for name in self.small:
            offset, nbytes = self.offsets[name]
            small[offset:offset + nbytes] = _span(tensors[name])[1]
        return [small, *(_span(tensors[n])[1] for n in self.large)]

    def build(self, flat: list[torch.Tensor]) -> nn.Module:
        """A model of the template's structure whose parameters and buffers are views of ``flat``
        (:meth:`flatten`'s buffers)."""
        raw = memoryview(flat[0].numpy()) if len(flat[0]) else memoryview(b"")
        spans = {name: raw[offset:offset + nbytes] for name, (offset, nbytes) in self.offsets.items()}
        spans.update((name, t.numpy()) for name, t in zip(self.large, flat[1:]))
        return pickle.loads(self.pickle, buffers=[bytearray(e) if isinstance(e, bytes) else spans[e]
                                                  for e in self.order])

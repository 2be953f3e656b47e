"""The checks every stage runs on what it trains and predicts: non-finite tensors, a GPU out of memory, and which
CUDA errors are an out of memory or leave the process's GPU context unusable (:func:`cuda_error_kind`).

Nothing non-finite passes silently: a training step's loss (:class:`~cosmos_pl.training.module.CosmosModule`), a
model's weights after a stage, the targets a stage trains on and every prediction are checked, and a
:class:`~cosmos_pl.errors.DivergenceError` names the stage (``where``: round, stage, client or teacher), the step and
the setting to change. No Lightning here: inference and evaluation use these checks too.
"""

from __future__ import annotations

import re
from typing import Optional

import torch
from torch import nn

from cosmos_pl.errors import DeviceMemoryError, DivergenceError
from cosmos_pl.training.config import TrainerConfig

__all__ = ["BROKEN_CONTEXT", "OUT_OF_MEMORY", "PREDICTION_FIX", "check_targets", "cuda_error_kind", "nonfinite_kind",
           "nonfinite_tensors", "out_of_memory"]

#: The settings to lower when a model's predictions are non-finite.
PREDICTION_FIX = ("lower the learning rate of the stages that trained it (a client: "
                  "clients.optimizer.init_args.lr, clients.distill_optimizer.init_args.lr; a teacher: "
                  "algorithm.init_args.teacher_optimizer.init_args.lr)")


def out_of_memory(where: str, batch_size: int | None, batch_key: str, trainer: TrainerConfig) -> DeviceMemoryError:
    """The one-line error for a GPU out of memory in the stage ``where`` (round, stage, client or teacher) at
    ``batch_size``, naming ``batch_key`` (the setting of that batch size) and the other settings that lower memory."""
    lower = [f"lower {batch_key}"]
    if trainer.precision in ("32-true", "32"):
        lower.append("train in trainer.precision=bf16-mixed")
    lower.append("run fewer workers per GPU (executor.workers_per_device)")
    return DeviceMemoryError(f"{where}: the GPU ran out of memory at batch size {batch_size} "
                             f"(trainer.precision={trainer.precision}); {', or '.join(lower)}")


#: :func:`cuda_error_kind`'s answers.
OUT_OF_MEMORY, BROKEN_CONTEXT = "out of memory", "broken context"

# GPU memory that ran out outside torch's caching allocator (which raises torch.OutOfMemoryError): a cuBLAS, cuSOLVER
# or cuSPARSE *_STATUS_ALLOC_FAILED, cuDNN's CUDNN_STATUS_ALLOC_FAILED and cuDNN 9's *_ALLOCATION_FAILED, and "out of
# memory" from the CUDA runtime or driver (cudaErrorMemoryAllocation) or from cuDNN, cuBLAS or torch itself
_MEMORY = re.compile(r"\bCU[A-Z]+_STATUS_\w*ALLOC(ATION)?_FAILED\b|\b(CUDA|cuDNN|cuBLAS)\b[^\n]*\bout of memory\b")
# CUDA errors after which the process's CUDA context is unusable ("the process must be terminated and relaunched",
# CUDA's driver_types.h), by the text cudaGetErrorString gives them, a cuBLAS or cuDNN kernel that failed to run, and
# torch.AcceleratorError named in a text (an exception that did not pickle crosses a worker's pipe as its description)
_BROKEN = re.compile(r"\bAcceleratorError:|device-side assert triggered|an illegal memory access was encountered|"
                     r"unspecified launch failure|misaligned address|an illegal instruction was encountered|invalid "
                     r"program counter|hardware stack error|the launch timed out and was terminated|uncorrectable ECC "
                     r"error|operation not supported on global/shared address space|"
                     r"\bCU(BLAS|DNN)_STATUS_EXECUTION_FAILED")


def cuda_error_kind(err: BaseException) -> Optional[str]:
    """What a task's exception says about the GPU: :data:`OUT_OF_MEMORY` (``torch.OutOfMemoryError``, or a memory
    status of cuBLAS, cuDNN or CUDA outside torch's allocator, e.g. ``CUBLAS_STATUS_ALLOC_FAILED``),
    :data:`BROKEN_CONTEXT` (any other ``torch.AcceleratorError``, torch's type for a failed CUDA call, or an error whose
    text names a CUDA error that leaves the process's CUDA context unusable: a device-side assert, an illegal memory
    access, a launch failure, a cuBLAS or cuDNN execution failure), else None. Read from the type and the text, so
    that an exception that crossed a worker's pipe (or only its text did) is classified the same way."""
    text = str(err)
    if isinstance(err, torch.OutOfMemoryError) or _MEMORY.search(text):
        return OUT_OF_MEMORY
    if isinstance(err, torch.AcceleratorError) or _BROKEN.search(text):
        return BROKEN_CONTEXT
    return None


def nonfinite_tensors(model: nn.Module) -> list[str]:
    """Names of ``model``'s floating-point parameters and buffers holding a NaN or an infinity (one host sync)."""
    named = [(k, t) for k, t in model.state_dict().items() if t.is_floating_point()]
    if not named:
        return []
    finite = torch.stack([torch.isfinite(t).all().to(named[0][1].device) for _, t in named]).tolist()
    return [k for (k, _), ok in zip(named, finite) if not ok]


def nonfinite_kind(t: torch.Tensor) -> str:
    """``"nan"`` when ``t`` holds a NaN, else ``"inf"`` (for a tensor known to hold a non-finite value)."""
    return "nan" if bool(torch.isnan(t).any()) else "inf"


def check_targets(targets: torch.Tensor, where: str) -> None:
    """Distillation targets ``[n, M]`` must be finite (they come from checked predictions; this guards the rest).

    Raises:
        DivergenceError: naming ``where`` and how many rows hold a NaN or an infinity.
    """
    rows = ~torch.isfinite(targets).all(dim=1)
    if bool(rows.any()):
        raise DivergenceError(f"{where}: the targets to train on are non-finite ({nonfinite_kind(targets)}) in "
                              f"{int(rows.sum())} of {len(targets)} rows: the model that produced them diverged; "
                              f"{PREDICTION_FIX}")

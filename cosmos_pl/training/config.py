"""The settings of every training stage (:class:`TrainerConfig`), the device they resolve to and each stage's seed.

Kept apart from :mod:`cosmos_pl.training.engine` (which imports Lightning) so that the command line can build,
document and check its settings without importing the trainer stack.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Literal, Optional, Union

import numpy as np
import torch

from cosmos_pl.errors import check

__all__ = ["RESIDENT_ATTR", "STAGE_IDS", "TrainerConfig", "apply_determinism", "autotuning", "inference_batch",
           "register_stage", "resolve_device", "stage_seed"]

#: The attribute naming a resident tensor (one the executor sends to each worker once; a stage keeps one GPU copy of
#: it per process), the same in the main process and in the workers.
RESIDENT_ATTR = "_cosmos_resident"

#: Stage name -> id, for :func:`stage_seed`: the clients' initial models here; every other stage's module adds its
#: own when imported (:func:`register_stage`: a client step's class, an algorithm's server stage). A new stage takes
#: a new id, so existing seeds never change.
STAGE_IDS: dict[str, int] = {"init": 0}


def register_stage(name: str, stage_id: int) -> None:
    """Add stage ``name`` with id ``stage_id`` to :data:`STAGE_IDS` (the same pair again: nothing to do).

    Raises:
        ValueError: ``name`` has another id, or ``stage_id`` is another stage's (their seeds would coincide).
    """
    taken = {i: n for n, i in STAGE_IDS.items()}
    if STAGE_IDS.get(name, stage_id) != stage_id or taken.get(stage_id, name) != name:
        known = ", ".join(f"{n}={i}" for n, i in STAGE_IDS.items())
        raise ValueError(f"stage {name!r} with id {stage_id}: the name or the id is taken ({known}); a new stage "
                         "takes a new name and an unused id")
    STAGE_IDS[name] = stage_id


@dataclass
class TrainerConfig:
    """Where and how every stage's Lightning Trainer runs.

    Args:
        accelerator: "auto" (CUDA when available, else CPU), "cpu", "gpu" or "cuda" (the GPU or nothing: without
            CUDA the run is refused, saying why and how to install a matching torch). The run's first line names
            the device it uses.
        precision: Lightning precision for training and autocast for inference: "32-true", "bf16-mixed", "16-mixed".
            bf16-mixed needs a GPU with native bfloat16 (compute capability 8.0 or newer) where the device is a
            GPU; on an older one the run is refused before training unless ``precision_fallback`` is set.
        precision_fallback: the precision to run in instead of bf16-mixed where a GPU in use has no native
            bfloat16 (compute capability below 8.0, e.g. a T4 or V100), with one printed line: "16-mixed" (float16
            with Lightning's gradient scaler) or "32-true"; null: refuse such a run before training.
        inference_batch_size: batch size for pseudo-labels on U and for evaluation (no gradients); unset: 1024 on
            a GPU, 128 on the CPU, where large batches run slower (see :func:`inference_batch`).
        channels_last: keep models and batches in channels-last memory format (faster convolutions on the
            CPU, docs/performance.md, and the fast path for mixed precision on GPUs).
        compile: wrap each backbone in ``torch.compile`` for training. The compile is paid in every process
            that trains (each parallel worker) for each architecture, and again where the input shapes or the
            train/eval state change (a smaller last batch, BatchNorm frozen); each worker compiles with one thread
            (``TORCHINDUCTOR_COMPILE_THREADS=1`` unless set). It pays off only for long stages (many steps per
            stage and process, on a GPU); a short stage can spend longer compiling than the compiled steps save.
        deterministic: ``true``: torch's deterministic algorithms only (an op without one raises), cuDNN
            deterministic, no cuDNN autotuning; ``"warn"``: the same, but such an op warns instead of raising;
            ``false``: torch's defaults (cuDNN autotuning only with ``benchmark``). On the CPU runs are exact with
            any value (same config, seed and thread count); on a GPU only ``true`` promises that; see
            docs/execution.md (Determinism).
        benchmark: cuDNN autotuning (``cudnn.benchmark``) on a GPU: each convolution's algorithm chosen by timing
            the candidates, which can be faster but makes the choice, and so the last digits, depend on timing;
            off by default (chosen without a GPU measurement). Only with ``deterministic: false``.
    """

    accelerator: Literal["auto", "cpu", "gpu", "cuda"] = "auto"
    precision: Literal["32-true", "32", "bf16-mixed", "16-mixed"] = "32-true"
    precision_fallback: Optional[Literal["16-mixed", "32-true"]] = None
    inference_batch_size: Optional[int] = None
    channels_last: bool = True
    compile: bool = False
    deterministic: Union[bool, Literal["warn"]] = False
    benchmark: bool = False

    def __post_init__(self) -> None:
        """Raises ConfigError for a batch size < 1, or ``benchmark`` with ``deterministic`` (whether CUDA exists
        and the GPUs run the precision: ``cosmos_pl.config.validate_config``)."""
        if self.inference_batch_size is not None:
            check(self.inference_batch_size >= 1, "trainer.inference_batch_size", self.inference_batch_size,
                  "must be >= 1")
        check(not (self.benchmark and self.deterministic is not False), "trainer.benchmark", self.benchmark,
              f"cuDNN autotuning picks algorithms by timing, which trainer.deterministic={self.deterministic!r} "
              "rules out; set one of them to false")


#: The inference batch size when ``trainer.inference_batch_size`` is unset, by device type. On the CPU a batch of
#: 1024 thrashes the caches, and 128 is faster per image (docs/performance.md, "Inference batch on the CPU").
DEFAULT_INFERENCE_BATCH = {"cuda": 1024, "cpu": 128}


def inference_batch(cfg: TrainerConfig, device: torch.device) -> int:
    """The inference batch size on ``device``: ``cfg.inference_batch_size``, or when unset
    :data:`DEFAULT_INFERENCE_BATCH` for the device's type."""
    if cfg.inference_batch_size is not None:
        return cfg.inference_batch_size
    return DEFAULT_INFERENCE_BATCH.get(device.type, DEFAULT_INFERENCE_BATCH["cuda"])


def apply_determinism(cfg: TrainerConfig) -> None:
    """Set torch's process-wide numerics flags from ``cfg.deterministic`` and ``cfg.benchmark`` (as Lightning's
    Trainer sets them for the same ``deterministic`` and ``benchmark`` arguments, which every stage's Trainer is
    given too): inference outside a Trainer runs under the same flags. cuDNN autotuning is on only where
    :func:`autotuning` says so."""
    deterministic = cfg.deterministic is not False
    torch.use_deterministic_algorithms(deterministic, warn_only=cfg.deterministic == "warn")
    torch.backends.cudnn.deterministic = deterministic
    torch.backends.cudnn.benchmark = autotuning(cfg.benchmark, cfg.deterministic,
                                                resolve_device(cfg.accelerator).type)
    if deterministic:  # cuBLAS needs a fixed workspace to be deterministic (torch's reproducibility notes)
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")


def autotuning(benchmark: bool, deterministic: Union[bool, str], device_type: str) -> bool:
    """Whether cuDNN autotuning (``cudnn.benchmark``) runs: ``benchmark`` (``trainer.benchmark``) asked for it,
    ``deterministic`` (``trainer.deterministic``) is false and ``device_type`` is "cuda"."""
    return bool(benchmark) and deterministic is False and device_type == "cuda"


def resolve_device(accelerator: str) -> torch.device:
    """The torch device for ``accelerator``; raises ValueError for "gpu"/"cuda" without CUDA, saying why and the fix
    (:func:`~cosmos_pl.training.cuda_check.cuda_unavailable_reason`). ``cuda`` without an index is CUDA's current
    device: a worker's only GPU, or the GPU the executor makes current for the tasks it runs in this process."""
    if accelerator == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if accelerator in ("gpu", "cuda"):
        if not torch.cuda.is_available():
            from cosmos_pl.training.cuda_check import cuda_unavailable_reason

            raise ValueError(f"trainer.accelerator={accelerator!r}: CUDA is not available: {cuda_unavailable_reason()}")
        return torch.device("cuda")
    return torch.device("cpu")


def stage_seed(seed: int, round_idx: int, stage: str, model_id: int) -> int:
    """A 32-bit seed derived from (seed, round, stage's id in :data:`STAGE_IDS`, model id) with numpy's SeedSequence.

    Raises:
        KeyError: ``stage`` is not registered (its module, which registers it, was not imported).
    """
    return int(np.random.SeedSequence([seed, round_idx, STAGE_IDS[stage], model_id]).generate_state(1)[0])

"""The settings of every training stage (:class:`TrainerConfig`), the device they resolve to and each stage's seed.

Kept apart from :mod:`cosmos_pl.training.stages` (which imports Lightning) so that the command line can build,
document and check its settings without importing the trainer stack.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

from cosmos_pl.errors import check

__all__ = ["TrainerConfig", "resolve_device", "stage_seed"]

# Stage ids for stage_seed; appended only, so existing seeds never change.
_STAGES = {"init": 0, "local": 1, "teacher": 2, "distill": 3, "teacher_init": 4, "joint": 5, "union": 6,
           "kmeans": 7}


@dataclass
class TrainerConfig:
    """Where and how every stage's Lightning Trainer runs.

    Args:
        accelerator: "auto" (CUDA when available, else CPU), "cpu", "gpu" or "cuda".
        precision: Lightning precision for training and autocast for inference: "32-true", "bf16-mixed", "16-mixed".
        inference_batch_size: batch size for pseudo-labels on U and for evaluation (no gradients).
        channels_last: keep models and batches in channels-last memory format (about 1.7x faster
            convolutions on this project's 2-core CPU, and the fast path for mixed precision on GPUs).
        compile: wrap each backbone in ``torch.compile`` for training (pays a compile per stage; worth it
            for long stages on a GPU).
    """

    accelerator: Literal["auto", "cpu", "gpu", "cuda"] = "auto"
    precision: Literal["32-true", "32", "bf16-mixed", "16-mixed"] = "32-true"
    inference_batch_size: int = 1024
    channels_last: bool = True
    compile: bool = False

    def __post_init__(self) -> None:
        """Raises ConfigError for a batch size < 1 (whether CUDA exists: ``cosmos_pl.config.validate_config``)."""
        check(self.inference_batch_size >= 1, "trainer.inference_batch_size", self.inference_batch_size, "must be >= 1")


def resolve_device(accelerator: str) -> torch.device:
    """The torch device for ``accelerator``; raises ValueError for "gpu"/"cuda" without CUDA."""
    if accelerator == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if accelerator in ("gpu", "cuda"):
        if not torch.cuda.is_available():
            raise ValueError(f"trainer.accelerator={accelerator!r} but CUDA is not available; use 'cpu' or 'auto'")
        return torch.device("cuda")
    return torch.device("cpu")


def stage_seed(seed: int, round_idx: int, stage: str, model_id: int) -> int:
    """A 32-bit seed derived from (seed, round, stage, model id) with numpy's SeedSequence."""
    return int(np.random.SeedSequence([seed, round_idx, _STAGES[stage], model_id]).generate_state(1)[0])

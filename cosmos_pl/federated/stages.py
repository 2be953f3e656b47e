"""One training stage = one Lightning Trainer over one model; plus batched inference and evaluation.

Each stage is seeded from (experiment seed, round, stage, model id), so its numbers do not depend on
what ran before it or where it runs (pitfall 9).
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from dataclasses import dataclass
from typing import Any, Literal

import lightning.pytorch as pl
import numpy as np
import torch
from lightning.fabric.utilities.seed import seed_everything
from torch import nn
from torch.utils.data import BatchSampler, DataLoader, Dataset, RandomSampler, SequentialSampler
from torchmetrics.classification import MulticlassAccuracy

from cosmos_pl.aggregation import aggregate
from cosmos_pl.losses import apply_temperature
from cosmos_pl.modules import DistillationModule, SupervisedModule
from cosmos_pl.modules.base import OptimizerFactory
from cosmos_pl.transforms import Transformations, prepare

__all__ = [
    "TrainerConfig",
    "stage_seed",
    "fit_supervised",
    "fit_distillation",
    "predict_probs",
    "evaluate",
    "resolve_device",
    "teacher_stage",
    "evaluate_client",
]

# Per-stage Trainers are many and short: keep their start-up chatter out of the console.
for _name in ("lightning.pytorch", "lightning.fabric", "lightning.pytorch.utilities.rank_zero"):
    logging.getLogger(_name).setLevel(logging.ERROR)
warnings.filterwarnings("ignore", message=".*does not have many workers.*")
warnings.filterwarnings("ignore", message=".*LeafSpec.*")
warnings.filterwarnings("ignore", message=".*smaller than the logging interval.*")
warnings.filterwarnings("ignore", message=".*Precision.*is not supported by the model summary.*")

_STAGES = {"init": 0, "local": 1, "teacher": 2, "distill": 3, "teacher_init": 4}


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


class _Batches(Dataset):
    """Map-style dataset indexed by a whole list of indices: one tensor gather per batch, no per-sample collate."""

    def __init__(self, *tensors: torch.Tensor) -> None:
        self.tensors = tensors

    def __len__(self) -> int:
        return len(self.tensors[0])

    def __getitem__(self, idx: list[int]) -> tuple[torch.Tensor, ...]:
        index = torch.as_tensor(idx)
        return tuple(t[index] for t in self.tensors)


def _loader(tensors: tuple[torch.Tensor, ...], batch_size: int, shuffle: bool) -> DataLoader:
    n = len(tensors[0])
    base = RandomSampler(range(n)) if shuffle else SequentialSampler(range(n))
    # drop a last batch of 1: BatchNorm cannot train on a single sample
    drop_last = shuffle and n > batch_size and n % batch_size == 1
    sampler = BatchSampler(base, batch_size=batch_size, drop_last=drop_last)
    return DataLoader(_Batches(*tensors), sampler=sampler, batch_size=None, num_workers=0)


def _on_device(trainer: TrainerConfig, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Hold a stage's (small, uint8) data on the GPU when there is one: batches are then gathered and
    augmented there, with no host-to-device copy per step."""
    device = resolve_device(trainer.accelerator)
    return tuple(t.to(device) for t in tensors) if device.type == "cuda" else tensors


def _fit(module: pl.LightningModule, trainer: TrainerConfig, epochs: int, loader: DataLoader) -> None:
    if trainer.compile:
        module.backbone = torch.compile(module.backbone)  # shares the parameters of the model trained in place
    _trainer(trainer, epochs).fit(module, train_dataloaders=loader)


def _trainer(cfg: TrainerConfig, epochs: int) -> pl.Trainer:
    accelerator = "gpu" if resolve_device(cfg.accelerator).type == "cuda" else "cpu"
    return pl.Trainer(
        accelerator=accelerator,
        devices=1,
        precision=cfg.precision,
        max_epochs=epochs,
        logger=False,  # one tracking run per experiment, stepped by round (pitfall 12)
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        use_distributed_sampler=False,
        num_sanity_val_steps=0,
        log_every_n_steps=1_000_000,
    )


def fit_supervised(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    epochs: int,
    batch_size: int,
    optimizer: OptimizerFactory,
    transformations: Transformations | None,
    trainer: TrainerConfig,
    seed: int,
) -> list[float]:
    """Train ``model`` in place with cross-entropy on ``x`` uint8 ``[n, C, H, W]``, ``y`` int64 ``[n]``.

    Returns the mean training loss of each epoch.
    """
    if epochs <= 0 or len(x) == 0:
        return []
    seed_everything(seed, verbose=False)
    module = SupervisedModule(model, optimizer, transformations, channels_last=trainer.channels_last)
    _fit(module, trainer, epochs, _loader(_on_device(trainer, x, y), batch_size, shuffle=True))
    model.cpu()
    return module.epoch_losses


def fit_distillation(
    model: nn.Module,
    x: torch.Tensor,
    targets: torch.Tensor,
    *,
    epochs: int,
    batch_size: int,
    optimizer: OptimizerFactory,
    transformations: Transformations | None,
    lam: float,
    num_views: int,
    trainer: TrainerConfig,
    seed: int,
    weights: torch.Tensor | None = None,
    target_grad: bool = False,
) -> list[float]:
    """Train ``model`` in place on U: ``x`` uint8 ``[n, C, H, W]``, soft ``targets`` ``[n, M]``, Eq. 1/2.

    ``weights`` ``[n]`` are the per-sample w_i(x) of Eq. 2 (default all ones). Returns per-epoch mean losses.
    """
    if epochs <= 0 or len(x) == 0:
        return []
    seed_everything(seed, verbose=False)
    w = torch.ones(len(x)) if weights is None else weights.float()
    module = DistillationModule(model, optimizer, transformations, lam=lam, num_views=num_views,
                                channels_last=trainer.channels_last, target_grad=target_grad)
    _fit(module, trainer, epochs, _loader(_on_device(trainer, x, targets.float(), w), batch_size, shuffle=True))
    model.cpu()
    return module.epoch_losses


def _autocast(device: torch.device, precision: str):
    if precision.startswith("bf16"):
        return torch.autocast(device.type, dtype=torch.bfloat16)
    if precision.startswith("16") and device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.float16)
    return contextlib.nullcontext()


def _batched_logits(model: nn.Module, x: torch.Tensor, trainer: TrainerConfig):
    device = resolve_device(trainer.accelerator)
    was_training = model.training
    model.eval().to(device)
    if trainer.channels_last:
        model.to(memory_format=torch.channels_last)
    try:
        with torch.inference_mode(), _autocast(device, trainer.precision):
            for start in range(0, len(x), trainer.inference_batch_size):
                batch = x[start : start + trainer.inference_batch_size].to(device, non_blocking=True)
                yield start, model(prepare(batch, channels_last=trainer.channels_last)).float()
    finally:
        model.cpu().train(was_training)


def predict_probs(model: nn.Module, x: torch.Tensor, trainer: TrainerConfig) -> torch.Tensor:
    """Soft pseudo-labels ``softmax(model(x))``: uint8 ``[n, C, H, W]`` -> float32 ``[n, M]`` on the CPU."""
    chunks = [logits.softmax(dim=1).cpu() for _, logits in _batched_logits(model, x, trainer)]
    return torch.cat(chunks) if chunks else torch.empty(0)


def evaluate(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, num_classes: int, trainer: TrainerConfig
) -> dict[str, float]:
    """Top-1 (and top-5 where M >= 20) accuracy of ``model`` on ``(x, y)`` as fractions, with torchmetrics."""
    metrics = {"top1": MulticlassAccuracy(num_classes, top_k=1, average="micro")}
    if num_classes >= 20:
        metrics["top5"] = MulticlassAccuracy(num_classes, top_k=5, average="micro")
    for start, logits in _batched_logits(model, x, trainer):
        target = y[start : start + len(logits)]
        for m in metrics.values():
            m.update(logits.cpu(), target)
    return {k: float(m.compute()) for k, m in metrics.items()}


def teacher_stage(model: nn.Module, cluster_labels: torch.Tensor, aggregation: str, temperature: float,
                  x: torch.Tensor, **fit: Any) -> torch.Tensor:
    """A cluster teacher's round (COSMOS Section 4.1 Step 3): aggregate its clients' pseudo-labels
    ``[G, n, M]`` (mean/median/max), apply the temperature, fit Eq. 1 on U ``x``, and return the teacher's
    pseudo-labels on U ``[n, M]``. ``fit`` holds the keyword arguments of :func:`fit_distillation`."""
    target = apply_temperature(aggregate(cluster_labels, aggregation), temperature)
    fit_distillation(model, x, target, **fit)
    return predict_probs(model, x, fit["trainer"])


def evaluate_client(model: nn.Module, teacher: nn.Module | None, x: torch.Tensor, y: torch.Tensor,
                    num_classes: int, trainer: TrainerConfig) -> tuple[dict[str, float], dict[str, float]]:
    """A client's test accuracies: its own model f_i and its cluster teacher h_pi(i) (empty before round 1)."""
    own = evaluate(model, x, y, num_classes, trainer)
    return own, (evaluate(teacher, x, y, num_classes, trainer) if teacher is not None else {})

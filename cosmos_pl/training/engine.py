"""The generic training engine: one Lightning Trainer per stage over one model, its loaders and its checks.

An objective (:mod:`cosmos_pl.objectives`) builds its LightningModule and its batches; this module runs them:
:func:`make_trainer` (devices, precision, determinism, no per-stage logger or checkpoint), :func:`loader` and
:func:`on_device` (batches gathered as whole index lists, on the GPU when there is one), :func:`fit` (the Trainer,
the out-of-memory and non-finite-weights checks, a stop request) and :func:`fit_labelled` (shuffled batches of a
labelled set). Each stage is seeded from (experiment seed, round, stage, model id), so its numbers do not depend on
what ran before it or where it runs.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
import weakref
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.fabric.utilities.seed import seed_everything
from torch import nn
from torch.utils.data import BatchSampler, DataLoader, Dataset, RandomSampler, SequentialSampler

from cosmos_pl import signals
from cosmos_pl.training.checks import nonfinite_tensors, out_of_memory
from cosmos_pl.training.config import RESIDENT_ATTR, TrainerConfig, apply_determinism, resolve_device
from cosmos_pl.training.module import CosmosModule

__all__ = ["Batches", "StopRequests", "fit", "fit_labelled", "loader", "make_trainer", "on_device", "quiet_lightning",
           "to_device"]

_LIGHTNING_LOGGERS = ("lightning.pytorch", "lightning.fabric", "lightning.pytorch.utilities.rank_zero")
_QUIET_WARNINGS = (".*does not have many workers.*", ".*LeafSpec.*", ".*smaller than the logging interval.*",
                   ".*Precision.*is not supported by the model summary.*")


@contextlib.contextmanager
def quiet_lightning():
    """Per-stage Trainers are many and short: hold back their start-up chatter during one stage only,
    leaving the process's logging and warning settings as they were."""
    loggers = [logging.getLogger(name) for name in _LIGHTNING_LOGGERS]
    levels = [lg.level for lg in loggers]
    with warnings.catch_warnings():
        for pattern in _QUIET_WARNINGS:
            warnings.filterwarnings("ignore", message=pattern)
        for lg in loggers:
            lg.setLevel(logging.ERROR)
        try:
            yield
        finally:
            for lg, level in zip(loggers, levels):
                lg.setLevel(level)


class Batches(Dataset):
    """Map-style dataset indexed by a whole list of indices: one tensor gather per batch, no per-sample collate."""

    def __init__(self, *tensors: torch.Tensor) -> None:
        self.tensors = tensors

    def __len__(self) -> int:
        return len(self.tensors[0])

    def __getitem__(self, idx: list[int]) -> tuple[torch.Tensor, ...]:
        index = torch.as_tensor(idx)
        return tuple(t[index] for t in self.tensors)


def loader(tensors: tuple[torch.Tensor, ...], batch_size: int, shuffle: bool) -> DataLoader:
    """Batches of ``tensors`` (each ``[n, ...]``), shuffled or in order, gathered by :class:`Batches`."""
    n = len(tensors[0])
    base = RandomSampler(range(n)) if shuffle else SequentialSampler(range(n))
    # drop a last batch of 1: BatchNorm cannot train on a single sample
    drop_last = shuffle and n > batch_size and n % batch_size == 1
    sampler = BatchSampler(base, batch_size=batch_size, drop_last=drop_last)
    return DataLoader(Batches(*tensors), sampler=sampler, batch_size=None, num_workers=0)


# GPU copies of resident tensors (a client's data, U: registered with Executor.keep_resident, which tags them), one
# per tensor and device in this process, kept for the process's life: later stages and rounds reuse them instead of
# copying the data to the GPU again. The weak reference checks that the copy is of this very tensor.
_DEVICE_COPIES: dict[tuple[str, str], tuple[weakref.ref, torch.Tensor]] = {}


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``t`` on ``device``; a resident tensor's copy is made once per process and device, then reused."""
    name = getattr(t, RESIDENT_ATTR, None)
    if name is None:
        return t.to(device)
    kept = _DEVICE_COPIES.get((name, str(device)))
    if kept is not None and kept[0]() is t:
        return kept[1]
    copy = t.to(device)
    _DEVICE_COPIES[(name, str(device))] = (weakref.ref(t), copy)
    return copy


def on_device(trainer: TrainerConfig, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Hold a stage's (small, uint8) data on the GPU when there is one: batches are then gathered and
    augmented there, with no host-to-device copy per step; a resident tensor's copy is made once per process."""
    device = resolve_device(trainer.accelerator)
    return tuple(to_device(t, device) for t in tensors) if device.type == "cuda" else tensors


def fit(module: CosmosModule, model: nn.Module, trainer: TrainerConfig, epochs: int, batches: Any) -> None:
    """Train ``module`` (whose backbone is ``model``) on the loader ``batches`` for ``epochs``; then check
    ``model``'s weights are finite.

    Raises:
        DivergenceError: a step's loss (see :class:`CosmosModule`) or, after training, a weight or floating
            buffer (e.g. BatchNorm statistics) is non-finite.
        DeviceMemoryError: the GPU ran out of memory (naming the batch size setting and what else lowers memory).
    """
    if trainer.compile:
        module.backbone = torch.compile(module.backbone)  # shares the parameters of the model trained in place
    out_of_memory_error = None
    try:
        with quiet_lightning():
            make_trainer(trainer, epochs).fit(module, train_dataloaders=batches)
    except torch.cuda.OutOfMemoryError:
        batch_key = ("clients.batch_size" if module.optimizer_key.startswith("clients.")
                     else "algorithm.init_args.teacher_batch_size")
        out_of_memory_error = out_of_memory(module.where, getattr(batches.sampler, "batch_size", None), batch_key,
                                            trainer)
    if out_of_memory_error is not None:  # outside the except block: its traceback no longer holds the activations
        torch.cuda.empty_cache()  # for the other workers on this GPU
        raise out_of_memory_error
    signals.check()  # a stop request whose exception was lost inside the stage (cosmos_pl.signals)
    bad = nonfinite_tensors(model)
    if bad:
        others = f" and {len(bad) - 1} other tensors" if len(bad) > 1 else ""
        raise module.diverged(f"after {epochs} epoch(s) the model's weights are non-finite ({bad[0]}{others}) "
                              f"although every training loss was finite")


def fit_labelled(model: nn.Module, module: CosmosModule, trained: nn.Module, x: torch.Tensor, y: torch.Tensor, *,
                 epochs: int, batch_size: int, trainer: TrainerConfig, seed: int) -> list[dict[str, float]]:
    """Train ``module`` (whose backbone is ``trained``, a part of ``model`` or all of it) on shuffled batches of
    ``(x, y)`` for ``epochs`` >= 1, seeded by ``seed``; ``model`` ends on the CPU. Returns the per-epoch losses."""
    seed_everything(seed, verbose=False)
    fit(module, trained, trainer, epochs, loader(on_device(trainer, x, y), batch_size, shuffle=True))
    model.cpu()
    return module.epoch_parts


class StopRequests(pl.Callback):
    """A safe point after every training batch: a SIGTERM/SIGINT whose exception was lost stops the stage there
    (:func:`cosmos_pl.signals.check`; Lightning itself only notices SIGTERM, and only by its own handler)."""

    def on_train_batch_end(self, *args: Any, **kwargs: Any) -> None:
        signals.check()


def make_trainer(cfg: TrainerConfig, epochs: int) -> pl.Trainer:
    """The Lightning Trainer of one stage: one device, ``cfg``'s precision and determinism, ``epochs`` epochs, no
    logger (one tracking run per experiment, stepped by round, is kept by the round loop), no checkpoint, no
    progress bar."""
    accelerator = "gpu" if resolve_device(cfg.accelerator).type == "cuda" else "cpu"
    apply_determinism(cfg)
    return pl.Trainer(
        accelerator=accelerator,
        devices=1,
        precision=cfg.precision,
        deterministic=cfg.deterministic,
        benchmark=torch.backends.cudnn.benchmark,
        max_epochs=epochs,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        use_distributed_sampler=False,
        num_sanity_val_steps=0,
        log_every_n_steps=1_000_000,
        callbacks=[StopRequests()],
    )

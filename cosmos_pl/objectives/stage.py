"""The stage runner every objective trains through: :func:`run_stage` does what each training stage does around
its LightningModule (the guard for an empty stage, the finite-targets check, the seed, the module's common
keywords, the fit and the hand-back on the CPU), so an objective's stage function names only its module, its data
and its own settings. It runs where the task runs (an executor worker, a Flower node); it imports Lightning.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch
from lightning.fabric.utilities.seed import seed_everything
from torch import nn
from torch.utils.data import DataLoader

from cosmos_pl.training.checks import check_targets
from cosmos_pl.training.config import TrainerConfig
from cosmos_pl.training.engine import fit, loader, on_device
from cosmos_pl.training.module import CosmosModule, OptimizerFactory
from cosmos_pl.transforms import Transformations

__all__ = ["run_stage", "shuffled"]


def shuffled(data: tuple[torch.Tensor, ...], batch_size: int) -> DataLoader:
    """Shuffled batches of ``data`` (each ``[n, ...]``, on one device): a new order every epoch."""
    return loader(data, batch_size, shuffle=True)


def run_stage(
    model: nn.Module,
    module: Callable[..., CosmosModule],
    data: tuple[torch.Tensor, ...],
    *,
    epochs: int,
    batch_size: int,
    optimizer: OptimizerFactory,
    transformations: Transformations | None,
    trainer: TrainerConfig,
    seed: int,
    where: str = "training",
    optimizer_key: str = "",
    part: str = "",
    targets: Optional[torch.Tensor] = None,
    batches: Callable[[tuple[torch.Tensor, ...], int], DataLoader] = shuffled,
    steps: Optional[int] = None,
    **settings: Any,
) -> list[dict[str, float]]:
    """Train ``model`` (or its submodule ``part``) in place for ``epochs`` on ``data``; returns one dict per epoch
    with the mean ``loss`` and the parts the module logs (``[]`` without an epoch or a sample).

    In order: nothing when ``epochs <= 0`` or ``data[0]`` is empty (before the module is built: building it sets the
    backbone's memory format); ``targets`` (soft targets ``[n, M]``, when the stage trains on some) checked finite;
    the global generators seeded with ``seed``; ``module(trained, optimizer, transformations, channels_last=...,
    where=..., optimizer_key=..., **settings)`` built; :func:`~cosmos_pl.training.engine.fit` on ``batches(data on
    the device, batch_size)`` (default :func:`shuffled`); ``model`` handed back on the CPU.

    Args:
        model: the client's (or teacher's) model, trained in place.
        module: a :class:`~cosmos_pl.training.module.CosmosModule` class (or a function building one) whose first
            argument is the backbone trained.
        data: the stage's tensors, each ``[n, ...]``: the module's batches hold the rows ``batches`` draws.
        epochs: the stage's epochs over ``data``.
        batch_size: the stage's batch size.
        optimizer: ``(parameters) -> torch.optim.Optimizer``, the stage's optimizer on the trained parameters.
        transformations: the stage's input transformations T.
        trainer: the Trainer settings (device, precision, determinism).
        seed: the stage's seed (:func:`~cosmos_pl.training.config.stage_seed`).
        where: the stage in error messages (e.g. ``"round 3, local training, client 2"``).
        optimizer_key: the optimizer setting in error messages (e.g. ``"clients.optimizer"``).
        part: the dotted name of the submodule trained (``""``: all of ``model``); its parameters with
            ``requires_grad=False`` stay fixed.
        targets: soft targets checked finite before training (None: no check).
        batches: ``(data, batch_size) -> DataLoader`` over ``data`` as it lies on the device.
        steps: train for this many optimizer steps instead (over as many epochs as they take; pFedHN's inner
            steps); None: ``epochs`` epochs.
        settings: the module's own keywords (its loss's weight, ...).

    Raises:
        DivergenceError: non-finite ``targets``, a non-finite step loss, or non-finite weights after training.
        DeviceMemoryError: the GPU ran out of memory (see :func:`~cosmos_pl.training.engine.fit`).
    """
    if epochs <= 0 or len(data[0]) == 0:
        return []
    if targets is not None:
        check_targets(targets, where)
    seed_everything(seed, verbose=False)
    trained = model.get_submodule(part) if part else model
    built = module(trained, optimizer, transformations, channels_last=trainer.channels_last, where=where,
                   optimizer_key=optimizer_key, **settings)
    fit(built, trained, trainer, epochs, batches(on_device(trainer, *data), batch_size), steps=steps)
    model.cpu()
    return built.epoch_parts

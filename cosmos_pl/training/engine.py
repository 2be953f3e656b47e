"""The generic training engine: one Lightning Trainer per stage over one model, its loaders and its checks.

An objective (:mod:`cosmos_pl.objectives`) builds its LightningModule and its batches; this module runs them:
:func:`make_trainer` (devices, precision, determinism, no per-stage logger or checkpoint), :func:`loader` and
:func:`on_device` (batches gathered by whole index tensors on the data's device, the GPU when there is one),
:func:`fit` (the Trainer, the out-of-memory and non-finite-weights checks, a stop request); the shared stage runner
(:func:`cosmos_pl.objectives.stage.run_stage`) calls it for every objective. Each stage is seeded from (experiment seed, round, stage, model id), so its
numbers do not depend on what ran before it or where it runs.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from typing import Any, Iterator, Optional

import lightning.pytorch as pl
import torch
from lightning.pytorch.plugins.environments import LightningEnvironment
from torch import nn
from torch.utils.data import DataLoader, Dataset, Sampler

from cosmos_pl import signals
from cosmos_pl.training.checks import OUT_OF_MEMORY, cuda_error_kind, nonfinite_tensors, out_of_memory
from cosmos_pl.training.config import TrainerConfig, apply_determinism, resolve_device
from cosmos_pl.training.module import CosmosModule
from cosmos_pl.training.resident import to_device

__all__ = ["Batches", "EpochOrder", "StopRequests", "fit", "loader", "make_trainer", "on_device",
           "quiet_lightning", "to_device"]

_LIGHTNING_LOGGERS = ("lightning.pytorch", "lightning.fabric", "lightning.pytorch.utilities.rank_zero")
# the srun hint: Lightning's `fit` asks SLURMEnvironment.detect() whatever the cluster environment (whether to resume
# from an "hpc" checkpoint), which warns on every fit where srun is installed and the process is not an srun step
_QUIET_WARNINGS = (".*does not have many workers.*", ".*LeafSpec.*", ".*smaller than the logging interval.*",
                   ".*Precision.*is not supported by the model summary.*",
                   ".*The `srun` command is available on your system but is not used.*")


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
    """Map-style dataset indexed by a whole batch of indices (an int64 tensor on the data's device, or a list): one
    tensor gather per batch, no per-sample collate."""

    def __init__(self, *tensors: torch.Tensor) -> None:
        self.tensors = tensors

    def __len__(self) -> int:
        return len(self.tensors[0])

    def __getitem__(self, idx: torch.Tensor | list[int]) -> tuple[torch.Tensor, ...]:
        index = torch.as_tensor(idx)
        return tuple(t[index] for t in self.tensors)


class EpochOrder(Sampler):
    """The batches of one epoch over ``n`` samples, each an int64 index tensor on ``device``: slices of one order
    that goes to the device once per epoch. A CPU index would be copied to the GPU at every step, a copy that waits
    for all the GPU work queued before it.

    Shuffled, the order is the permutation torch's ``RandomSampler`` draws: a seed taken from the global generator
    when the epoch starts, then ``randperm`` on the CPU with it, so a stage's seed gives the same batches on every
    device. Drawn on the GPU instead, it would differ from the CPU's.

    Args:
        n: samples per epoch.
        batch_size: samples per batch (the last one may be smaller).
        shuffle: a new random order each epoch, else ``0..n-1``.
        drop_last: leave out the last batch when it is smaller than ``batch_size``.
        device: where the data to index is.
    """

    def __init__(self, n: int, batch_size: int, shuffle: bool, drop_last: bool, device: torch.device) -> None:
        self.n, self.batch_size, self.shuffle, self.drop_last, self.device = n, batch_size, shuffle, drop_last, device

    def __len__(self) -> int:
        return self.n // self.batch_size if self.drop_last else -(-self.n // self.batch_size)

    def __iter__(self) -> Iterator[torch.Tensor]:
        if self.shuffle:
            seed = int(torch.empty((), dtype=torch.int64).random_().item())  # as RandomSampler takes it
            order = torch.randperm(self.n, generator=torch.Generator().manual_seed(seed))
        else:
            order = torch.arange(self.n)
        order = order.to(self.device, non_blocking=True)
        b = self.batch_size
        for i in range(len(self)):
            yield order[i * b:(i + 1) * b]


def loader(tensors: tuple[torch.Tensor, ...], batch_size: int, shuffle: bool) -> DataLoader:
    """Batches of ``tensors`` (each ``[n, ...]``, all on one device), shuffled or in order, gathered by
    :class:`Batches` with index tensors on that device (:class:`EpochOrder`)."""
    n = len(tensors[0])
    # drop a last batch of 1: BatchNorm cannot train on a single sample
    drop_last = shuffle and n > batch_size and n % batch_size == 1
    sampler = EpochOrder(n, batch_size, shuffle, drop_last, tensors[0].device)
    return DataLoader(Batches(*tensors), sampler=sampler, batch_size=None, num_workers=0)


def on_device(trainer: TrainerConfig, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Hold a stage's (small, uint8) data on the GPU when there is one: batches are then gathered and
    augmented there, with no host-to-device copy per step; a resident tensor's copy is made once per process."""
    device = resolve_device(trainer.accelerator)
    return tuple(to_device(t, device) for t in tensors) if device.type == "cuda" else tensors


def fit(module: CosmosModule, model: nn.Module, trainer: TrainerConfig, epochs: int, batches: Any,
        steps: Optional[int] = None) -> None:
    """Train ``module`` (whose backbone is ``model``) on the loader ``batches`` for ``epochs`` (or, with ``steps``,
    for that many optimizer steps over as many epochs as they take); then check ``model``'s weights are finite.

    Raises:
        DivergenceError: a step's loss (see :class:`CosmosModule`) or, after training, a weight or floating
            buffer (e.g. BatchNorm statistics) is non-finite.
        DeviceMemoryError: the GPU ran out of memory, in torch's allocator or in a cuBLAS, cuDNN or CUDA call
            (:func:`~cosmos_pl.training.checks.cuda_error_kind`), naming the batch size setting and what else lowers
            memory.
    """
    if trainer.compile:
        module.backbone = torch.compile(module.backbone)  # shares the parameters of the model trained in place
    out_of_memory_error = None
    try:
        with quiet_lightning():
            make_trainer(trainer, epochs, steps=steps).fit(module, train_dataloaders=batches)
    except Exception as err:
        if cuda_error_kind(err) != OUT_OF_MEMORY:
            raise
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


class StopRequests(pl.Callback):
    """A safe point after every training batch: a SIGTERM/SIGINT whose exception was lost stops the stage there
    (:func:`cosmos_pl.signals.check`; Lightning itself only notices SIGTERM, and only by its own handler)."""

    def on_train_batch_end(self, *args: Any, **kwargs: Any) -> None:
        signals.check()


def make_trainer(cfg: TrainerConfig, epochs: int, steps: Optional[int] = None) -> pl.Trainer:
    """The Lightning Trainer of one stage: one device, ``cfg``'s precision and determinism, ``epochs`` epochs (or
    ``steps`` optimizer steps, the epochs then unbounded), no
    logger (one tracking run per experiment, stepped by round, is kept by the round loop), no checkpoint, no
    progress bar. The device on a GPU is the process's current CUDA device: the GPU a worker is pinned to (its only
    one), or the one the executor makes current for the tasks it runs in this process (``executor.devices: [1]``).
    The cluster environment is always Lightning's own single-process one (``LightningEnvironment``): inside a Slurm
    job (``compare --launcher slurm``) Lightning would otherwise take the job's ``SLURM_*`` variables as its
    processes' layout and install its own requeue signal handler, and print its hint to use ``srun`` where srun is
    installed (the hint its ``fit`` prints all the same is held back by :func:`quiet_lightning`)."""
    accelerator = "gpu" if resolve_device(cfg.accelerator).type == "cuda" else "cpu"
    apply_determinism(cfg)
    return pl.Trainer(
        accelerator=accelerator,
        devices=[torch.cuda.current_device()] if accelerator == "gpu" else 1,
        precision=cfg.precision,
        deterministic=cfg.deterministic,
        benchmark=torch.backends.cudnn.benchmark,
        max_epochs=epochs if steps is None else -1,
        max_steps=-1 if steps is None else steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        use_distributed_sampler=False,
        num_sanity_val_steps=0,
        log_every_n_steps=1_000_000,
        callbacks=[StopRequests()],
        plugins=[LightningEnvironment()],
    )

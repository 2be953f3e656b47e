"""Where independent stage work runs: in this process one task after another, or in a pool of workers.

A task is one model's stage (a client's local training, its pseudo-labels on U, a cluster teacher, a
client's distillation, an evaluation). Tasks of a stage are independent, and each is seeded from
(seed, round, stage, id), so results do not depend on the executor or the number of workers. Workers are
processes started with ``spawn``; models and tensors travel between processes as CPU tensors through
torch's shared-memory pickling, never through files. On CUDA each worker is pinned to one GPU
(``CUDA_VISIBLE_DEVICES``) and several workers may share one (``workers_per_device``).
"""

from __future__ import annotations

import multiprocessing as mp
import os
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Literal, Optional, Sequence, Union

import torch

from cosmos_pl.errors import ConfigError, check

__all__ = ["ExecutorConfig", "Executor", "Task", "available_cpus", "resolve_devices"]

Task = tuple[Callable[..., Any], dict[str, Any]]


@dataclass
class ExecutorConfig:
    """How a stage's independent tasks are spread.

    Args:
        kind: 'sequential' (one after another in this process) or 'parallel' (a pool of spawned workers).
        devices: 'auto' (every visible GPU, else one CPU slot), a count N (GPUs 0..N-1, or N CPU slots without CUDA), or a list of GPU ids.
        workers_per_device: workers sharing each device (several small clients can share one large GPU).
        threads_per_worker: torch CPU threads in every task, sequential included; None splits this machine's cores among the workers. Equal values give bit-identical results across executors.
    """

    kind: Literal["sequential", "parallel"] = "sequential"
    devices: Union[Literal["auto"], int, list[int]] = "auto"
    workers_per_device: int = 1
    threads_per_worker: Optional[int] = None

    def __post_init__(self) -> None:
        """Raises ConfigError for a value out of range (whether GPU ids exist is :func:`resolve_devices`'s check)."""
        d = self.devices
        check(d == "auto" or (isinstance(d, int) and d >= 1) or (isinstance(d, list) and d and min(d) >= 0),
              "executor.devices", d, "use 'auto', a count >= 1, or a non-empty list of GPU ids >= 0")
        check(self.workers_per_device >= 1, "executor.workers_per_device", self.workers_per_device, "must be >= 1")
        check(self.threads_per_worker is None or self.threads_per_worker >= 1, "executor.threads_per_worker",
              self.threads_per_worker, "must be >= 1, or null to split this machine's cores among the workers")


def resolve_devices(devices: Union[str, int, list[int]], accelerator: str = "auto") -> list[Optional[int]]:
    """GPU ids to pin workers to; ``[None] * N`` for N CPU slots (always CPU slots when
    ``trainer.accelerator`` is ``"cpu"``, so a CPU run asks for the same slots on any machine).

    Raises:
        ConfigError: a bad value or GPU ids that do not exist, naming the field and the fix.
    """
    n_gpu = 0 if accelerator == "cpu" else torch.cuda.device_count()
    if devices == "auto":
        return list(range(n_gpu)) if n_gpu else [None]
    if isinstance(devices, int):
        if devices < 1:
            raise ConfigError(f"executor.devices={devices}: must be >= 1, a list of GPU ids, or 'auto'")
        if n_gpu:
            if devices > n_gpu:
                raise ConfigError(f"executor.devices={devices} but only {n_gpu} GPU(s) are visible; "
                                  f"give at most {n_gpu}, or 'auto'")
            return list(range(devices))
        return [None] * devices
    if isinstance(devices, list) and devices:
        bad = [d for d in devices if not 0 <= d < n_gpu]
        if bad:
            raise ConfigError(f"executor.devices={devices}: GPU ids {bad} do not exist ({n_gpu} visible); use 'auto'")
        return list(devices)
    raise ConfigError(f"executor.devices={devices!r}: use 'auto', a count, or a list of GPU ids")


def available_cpus() -> int:
    """The CPU cores this process may run on: its affinity mask (``taskset``, a container's cpuset, a test
    worker pinned to one core), else ``os.cpu_count()``."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS and Windows have no affinity mask
        return os.cpu_count() or 1


def _threads(cfg: ExecutorConfig, workers: int) -> int:
    if cfg.threads_per_worker is not None:
        if cfg.threads_per_worker < 1:
            raise ConfigError(f"executor.threads_per_worker={cfg.threads_per_worker}: must be >= 1 or null")
        return cfg.threads_per_worker
    return max(1, available_cpus() // workers)


def _init_worker(slots: Any, threads: int) -> None:
    gpu = slots.get()
    if gpu is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = str(gpu)  # before CUDA is first touched in this process
    torch.set_num_threads(threads)


def _run(fn: Callable[..., Any], kwargs: dict[str, Any], returns_model: bool) -> tuple[Any, Any]:
    out = fn(**kwargs)
    # a trained model changed in this process: send it back; a read-only one need not travel again
    return (kwargs.get("model") if returns_model else None), out


class Executor:
    """Runs a stage's tasks; ``map`` yields ``(index, model, output)`` as tasks finish.

    Each task is ``(fn, kwargs)``; ``fn`` trains or reads ``kwargs["model"]`` in place (when there is one)
    and returns a small output. With ``returns_model`` the (trained) model is yielded too: in parallel mode
    it is a copy from the worker, which the caller puts in place of its own.
    """

    def __init__(self, cfg: ExecutorConfig, accelerator: str = "auto") -> None:
        if cfg.workers_per_device < 1:
            raise ConfigError(f"executor.workers_per_device={cfg.workers_per_device}: must be >= 1")
        self.cfg = cfg
        self.slots = resolve_devices(cfg.devices, accelerator) * cfg.workers_per_device
        self.parallel = cfg.kind == "parallel" and len(self.slots) > 1
        self.threads = _threads(cfg, len(self.slots) if self.parallel else 1)
        self._pool: Optional[ProcessPoolExecutor] = None

    def _start(self) -> ProcessPoolExecutor:
        if self._pool is None:
            ctx = mp.get_context("spawn")
            slots = ctx.Queue()
            for s in self.slots:
                slots.put(s)
            self._pool = ProcessPoolExecutor(len(self.slots), mp_context=ctx, initializer=_init_worker,
                                             initargs=(slots, self.threads))
        return self._pool

    def map(self, tasks: Sequence[Task], costs: Optional[Sequence[float]] = None,
            returns_model: bool = False) -> Iterator[tuple[int, Any, Any]]:
        if not self.parallel:
            previous = torch.get_num_threads()
            torch.set_num_threads(self.threads)
            try:
                for i, (fn, kwargs) in enumerate(tasks):
                    yield i, kwargs.get("model"), fn(**kwargs)
            finally:
                torch.set_num_threads(previous)
            return
        pool = self._start()
        # largest estimated cost first, so a big task does not start last and leave workers idle
        order = sorted(range(len(tasks)), key=lambda i: -(costs[i] if costs else 0.0))
        futures: dict[Future, int] = {pool.submit(_run, *tasks[i], returns_model): i for i in order}
        for fut in as_completed(futures):
            model, out = fut.result()
            yield futures[fut], model, out

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)
            self._pool = None



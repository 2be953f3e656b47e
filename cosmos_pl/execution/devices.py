"""The machine's devices for a run: which GPUs and CPU cores it may use, how many workers fit on a GPU, and the
shared memory parallel workers need.

GPUs are numbered as this process sees them (``CUDA_VISIBLE_DEVICES`` renumbers them from 0); :func:`physical_gpu`
gives the entry a child process pinned to one of them is given. ``workers_per_device: auto`` reads the GPUs' free
memory with ``nvidia-smi`` (so that this process opens no CUDA context on them) and sizes the workers per GPU from
the largest model (:func:`workers_per_gpu`); :func:`shared_memory_plan` says whether the data that parallel workers
keep all run fits in ``/dev/shm``. The executor (:mod:`cosmos_pl.execution.executor`) and compare's
side-by-side pairs use these.
"""

from __future__ import annotations

import os
import shutil
from typing import Optional, Sequence, Union

import torch

from cosmos_pl.errors import ConfigError

__all__ = ["resolve_devices", "physical_gpu", "available_cpus", "worker_threads", "shared_memory_free",
           "shared_memory_plan", "SHARED", "PRIVATE", "SEQUENTIAL", "CUDA_CONTEXT_BYTES",
           "MAX_WORKERS_PER_DEVICE", "worker_gpu_bytes", "auto_workers_per_device", "gpu_free_bytes",
           "workers_per_gpu", "too_many_threads"]


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


def physical_gpu(index: int) -> str:
    """The ``CUDA_VISIBLE_DEVICES`` entry of visible GPU ``index`` (this process's own ``CUDA_VISIBLE_DEVICES``
    renumbers the GPUs it lists from 0): what a child process pinned to that GPU is given."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None or not visible.strip():
        return str(index)
    return [v.strip() for v in visible.split(",") if v.strip()][index]


def shared_memory_free(path: str = "/dev/shm") -> Optional[int]:
    """Free bytes of ``path`` (where torch and the executor put shared memory); None where there is no such file
    system (macOS, Windows)."""
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


SHARED, PRIVATE, SEQUENTIAL = "shared", "private", "sequential"


def shared_memory_plan(need: int, free: Optional[int], workers: int, *, explicit: bool,
                       available: Optional[int] = None, path: str = "/dev/shm") -> tuple[str, Optional[str]]:
    """How parallel workers get the data that stays the same for a run (every client's data and U, ``need`` bytes
    laid out in one shared arena), given ``free`` bytes in ``path``: ``(mode, line)``.

    - ``"shared"`` (line None): it fits in 90% of ``path`` (or there is no such file system): one copy, mapped by
      every worker;
    - otherwise, for an executor the user left to choose (``explicit`` False): ``"private"``, each of the ``workers``
      gets its own copy through its pipe, when ``workers * need`` fits in half of the ``available`` memory (or that
      is unknown); else ``"sequential"``: no workers. ``line`` says which and why.

    Models, targets and results never use ``path`` (they cross the pipes by value), so ``need`` does not grow with
    the number of workers.

    Raises:
        ConfigError: it does not fit and the parallel workers were asked for (``explicit``: ``executor.kind:
            parallel`` or a number of ``workers_per_device``), naming the sizes, Docker's ``--shm-size`` and the
            settings that let it run.
    """
    if free is None or need <= 0.9 * free:
        return SHARED, None
    mib = 2 ** 20
    size = f"--shm-size={max(1, -(-2 * need // 2 ** 30))}g"
    where = f"the clients' data and U need about {need / mib:.0f} MiB of shared memory ({path}), and it has " \
            f"{free / mib:.0f} MiB free"
    if explicit:
        raise ConfigError(
            f"executor: {workers} parallel workers were asked for, and {where}: give the container more (docker run "
            f"{size}), or leave executor.kind and executor.workers_per_device at auto (a copy per worker, or "
            "sequential), or use executor.kind sequential")
    if available is None or workers * need <= available // 2:
        return PRIVATE, (f"executor: {where}: each of the {workers} workers gets its own copy instead (about "
                         f"{workers * need / mib:.0f} MiB of memory in all); docker run {size} lets them share one")
    return SEQUENTIAL, (f"executor: sequential, in this process: {where}, and a copy for each of the {workers} workers "
                        f"({workers * need / mib:.0f} MiB) would not fit in half of the {available / mib:.0f} MiB of "
                        f"memory available; docker run {size} lets the workers share one copy")


CUDA_CONTEXT_BYTES = 600 * 2 ** 20  # a process's CUDA context and torch's kernels (about 0.5 GiB on recent GPUs)
# processes on one GPU take turns on it (time slices, unless NVIDIA MPS is running): more workers hide each other's
# CPU-side work (batch gathering, kernel launches) up to a point; 4 is a guess, not measured on a GPU
MAX_WORKERS_PER_DEVICE = 4


def worker_gpu_bytes(parameters: int, data_bytes: int) -> int:
    """GPU bytes one worker needs for a task (an estimate): a CUDA context (:data:`CUDA_CONTEXT_BYTES`), float32
    weights, gradients and Adam's two moments (16 bytes per parameter of the largest model), as much again for
    activations and the allocator's slack, and the data the worker keeps on the device (``data_bytes``, uint8
    images: the resident tensors it has been sent, :meth:`~cosmos_pl.execution.executor.Executor.keep_resident`)."""
    return CUDA_CONTEXT_BYTES + 2 * 16 * parameters + data_bytes


def auto_workers_per_device(free: Sequence[int], need: int, cpus: int, tasks: int) -> int:
    """Workers per GPU for ``workers_per_device: auto``: as many as fit in 80% of the GPU with the least free memory
    (``free`` bytes per GPU, ``need`` bytes per worker), at most one per CPU core (``cpus`` over the GPUs), no more
    than a stage's ``tasks`` need (spread over the GPUs) and :data:`MAX_WORKERS_PER_DEVICE`; at least 1.

    Example: 2 GPUs with 20 GiB free, 2 GiB per worker, 16 cores, 25 clients: min(8, 8, 13, 4) = 4; with 6 GiB
    per worker: min(2, 8, 13, 4) = 2."""
    gpus = max(1, len(free))
    fits = int(0.8 * min(free) // need) if free else 1
    return max(1, min(fits, cpus // gpus, -(-tasks // gpus), MAX_WORKERS_PER_DEVICE))


def gpu_free_bytes(gpus: Sequence[int]) -> Optional[list[int]]:
    """Free memory of visible GPUs ``gpus`` (bytes), read by ``nvidia-smi`` so that this process opens no CUDA
    context on them; None where ``nvidia-smi`` is absent or fails (a MIG slice's id, which it does not take).

    CUDA numbers GPUs fastest first unless ``CUDA_DEVICE_ORDER=PCI_BUS_ID``, ``nvidia-smi`` by PCI bus: the two
    agree where every GPU is the same model. Where they may not (GPUs of several models, that order not set), each
    GPU is given the least free memory of all of them."""
    import subprocess

    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None

    def query(*select: str) -> list[tuple[str, int]]:
        done = subprocess.run([exe, "--query-gpu=name,memory.free", "--format=csv,noheader,nounits", *select],
                              capture_output=True, text=True, timeout=30, check=True)
        return [(name.strip(), int(float(free)) * 2 ** 20) for name, free in
                (line.rsplit(",", 1) for line in done.stdout.splitlines() if line.strip())]  # MiB

    try:
        every = query()
        if len({name for name, _ in every}) > 1 and os.environ.get("CUDA_DEVICE_ORDER") != "PCI_BUS_ID":
            return [min(free for _, free in every)] * len(gpus)
        return [query("-i", physical_gpu(gpu))[0][1] for gpu in gpus]
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def available_cpus() -> int:
    """The CPU cores this process may run on: its affinity mask (``taskset``, a container's cpuset, a test
    worker pinned to one core), else ``os.cpu_count()``."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS and Windows have no affinity mask
        return os.cpu_count() or 1


def worker_threads(threads_per_worker: Optional[int], workers: int) -> int:
    """Torch CPU threads in each task: ``threads_per_worker`` (``executor.threads_per_worker``) when given, else this
    machine's cores (:func:`available_cpus`) split among ``workers``, at least 1.

    Raises:
        ConfigError: ``threads_per_worker`` below 1.
    """
    if threads_per_worker is not None:
        if threads_per_worker < 1:
            raise ConfigError(f"executor.threads_per_worker={threads_per_worker}: must be >= 1 or null")
        return threads_per_worker
    return max(1, available_cpus() // workers)


def too_many_threads(threads_per_worker: Optional[int], cpus: int) -> Optional[str]:
    """The line that warns of ``executor.threads_per_worker`` above this machine's ``cpus`` cores (torch's threads in
    one task then take turns on the cores, and a stage runs many times slower), or None."""
    if threads_per_worker is None or threads_per_worker <= cpus:
        return None
    return (f"warning: executor.threads_per_worker={threads_per_worker} is more than this machine's {cpus} CPU "
            f"core(s): each task's threads take turns on them, which can make a stage many times slower; give at "
            f"most {cpus}, or null to split the cores among the workers")


def workers_per_gpu(gpus: Sequence[int], parameters: int, data_bytes: int, tasks: int) -> tuple[int, str]:
    """``workers_per_device: auto`` on the visible GPUs ``gpus``: the workers per GPU
    (:func:`auto_workers_per_device`) for a largest model of ``parameters`` and ``data_bytes`` kept on the GPU
    (:func:`worker_gpu_bytes`) and a stage of at most ``tasks`` tasks, and the line that says so. Without
    ``nvidia-smi`` (:func:`gpu_free_bytes` is None) one worker per GPU, said so."""
    need = worker_gpu_bytes(parameters, data_bytes)
    free = gpu_free_bytes(gpus)
    if free is None:
        return 1, ("executor: 1 worker per GPU (workers_per_device auto: nvidia-smi did not answer, so the GPUs' free "
                   "memory is unknown; give executor.workers_per_device a number to run more)")
    per_device = auto_workers_per_device(free, need, available_cpus(), tasks)
    gib = 2 ** 30
    return per_device, (f"executor: {per_device} worker(s) per GPU on {len(gpus)} GPU(s) (workers_per_device "
                        f"auto: {min(free) / gib:.1f} GiB free on the fullest GPU, about {need / gib:.2f} GiB per "
                        f"worker, {available_cpus()} CPU cores, {tasks} tasks per stage at most)")

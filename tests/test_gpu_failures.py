"""CUDA errors in a stage, checked on the CPU by raising them by hand (as a CUDA kernel or a cuBLAS call would): a
memory status outside torch's allocator is an out of memory, with the same one line; an error that leaves a CUDA
context unusable ends the worker that hit it (replaced; only its task fails) or, in the main process, the run; an out
of memory where several workers share a GPU is tried once more on a fresh worker."""

import os

import pytest
import torch
from torch import nn

from cosmos_pl.errors import DeviceError, DeviceMemoryError
from cosmos_pl.execution.executor import Executor, ExecutorConfig
from cosmos_pl.execution.task_failure import TaskFailure
from cosmos_pl.training.checks import BROKEN_CONTEXT, OUT_OF_MEMORY, cuda_error_kind

pytestmark = pytest.mark.gpu_path

ILLEGAL_ADDRESS = "CUDA error: an illegal memory access was encountered\nCUDA kernel errors might be asynchronously " \
                  "reported at some other API call, so the stacktrace below might be incorrect."
CUBLAS_ALLOC = "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"


@pytest.mark.parametrize("err, kind", [
    # out of memory: torch's allocator, and what cuBLAS, cuDNN and CUDA say outside it
    (torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"), OUT_OF_MEMORY),
    (RuntimeError(CUBLAS_ALLOC), OUT_OF_MEMORY),
    (RuntimeError("cuDNN error: CUDNN_STATUS_ALLOC_FAILED"), OUT_OF_MEMORY),
    (RuntimeError("cuDNN error: CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED"), OUT_OF_MEMORY),
    (torch.AcceleratorError("CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported"),
     OUT_OF_MEMORY),
    (RuntimeError("CUDA driver error: out of memory"), OUT_OF_MEMORY),
    # a CUDA context left unusable: any other AcceleratorError, or the text of a sticky error
    (torch.AcceleratorError("CUDA error: device-side assert triggered"), BROKEN_CONTEXT),
    (torch.AcceleratorError("CUDA error: invalid argument"), BROKEN_CONTEXT),
    (RuntimeError(ILLEGAL_ADDRESS), BROKEN_CONTEXT),
    (RuntimeError("CUDA error: unspecified launch failure"), BROKEN_CONTEXT),
    (RuntimeError("CUDA error: misaligned address"), BROKEN_CONTEXT),
    (RuntimeError("CUDA error: CUBLAS_STATUS_EXECUTION_FAILED when calling `cublasSgemm( handle, opa, opb)`"),
     BROKEN_CONTEXT),
    (RuntimeError("cuDNN error: CUDNN_STATUS_EXECUTION_FAILED"), BROKEN_CONTEXT),
    (RuntimeError("AcceleratorError: CUDA error: invalid argument"), BROKEN_CONTEXT),  # one that did not pickle
    # neither: the CPU's own memory, an unsupported cuDNN case, an ordinary error
    (RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 8589934592 bytes"), None),
    (RuntimeError("cuDNN error: CUDNN_STATUS_NOT_SUPPORTED"), None),
    (RuntimeError("mat1 and mat2 shapes cannot be multiplied (4x3 and 5x2)"), None),
    (ValueError("out of memory"), None),
])
def test_cuda_errors_are_classified(err, kind):
    assert cuda_error_kind(err) == kind


class _Failing(nn.Sequential):
    """``[B, 1, 8, 8] -> [B, 3]``; raises ``message`` (a RuntimeError, as a cuBLAS call would) in every forward."""

    def __init__(self, message: str) -> None:
        torch.manual_seed(0)
        super().__init__(nn.Flatten(), nn.Linear(64, 3))
        self.message = message

    def forward(self, x):
        raise RuntimeError(self.message)


def test_a_cublas_allocation_failure_is_an_out_of_memory_with_the_same_advice():
    # imported here: the spawned workers of the tests below import this module, and need no Lightning
    from cosmos_pl.objectives.local_fit import fit_supervised
    from cosmos_pl.training.config import TrainerConfig
    from cosmos_pl.training.module import default_optimizer

    g = torch.Generator().manual_seed(0)
    x, y = torch.randint(0, 256, (40, 1, 8, 8), dtype=torch.uint8, generator=g), torch.randint(0, 3, (40,), generator=g)
    with pytest.raises(DeviceMemoryError) as err:  # in training: the stage's own line, as torch's OutOfMemoryError
        fit_supervised(_Failing(CUBLAS_ALLOC), x, y, epochs=1, batch_size=16, optimizer=default_optimizer(1e-3),
                       transformations=None, trainer=TrainerConfig(accelerator="cpu", channels_last=False), seed=0,
                       where="round 0, local training, client 4", optimizer_key="clients.optimizer")
    assert str(err.value) == (
        "round 0, local training, client 4: the GPU ran out of memory at batch size 16 (trainer.precision=32-true); "
        "lower clients.batch_size, or train in trainer.precision=bf16-mixed, or run fewer workers per GPU "
        "(executor.workers_per_device)")
    # outside a stage's own check: the executor's line, never a client's failure
    executor = Executor(ExecutorConfig(kind="sequential", threads_per_worker=1), "cpu")
    with pytest.raises(DeviceMemoryError) as err:
        list(executor.map([(_raise, {"message": CUBLAS_ALLOC})], tolerate=True))
    assert str(err.value) == (
        f"a task ran the GPU out of memory (RuntimeError: {CUBLAS_ALLOC}); run fewer workers per GPU "
        "(executor.workers_per_device), or lower the clients' data on the GPU with smaller models or "
        "trainer.precision=bf16-mixed")


def _raise(message: str):
    raise RuntimeError(message)


def _square_here(v: int, sticky: bool = False):
    """``(v * v, this process's id)``; with ``sticky`` the CUDA error torch raises after an illegal memory access."""
    if sticky:
        raise torch.AcceleratorError(ILLEGAL_ADDRESS)
    return v * v, os.getpid()


def test_a_sticky_cuda_error_in_the_main_process_stops_the_run_in_one_line():
    executor = Executor(ExecutorConfig(kind="sequential", threads_per_worker=1), "cpu")
    got = []
    with pytest.raises(DeviceError) as err:  # tolerated or not: every later task here would fail the same way
        for i, _, out in executor.map([(_square_here, {"v": v, "sticky": v == 1}) for v in range(3)], tolerate=True):
            got.append((i, out[0]))
    assert got == [(0, 0)]
    assert str(err.value) == (
        "executor: a task hit a CUDA error that leaves this process's CUDA context unusable (AcceleratorError: CUDA "
        "error: an illegal memory access was encountered CUDA kernel errors might be asynchronously reported at some "
        "other API call, so the stacktrace below might be incorrect.), so the run stops; a device-side assert is most "
        "often a label or an index out of range (CUDA_LAUNCH_BLOCKING=1 names the operation); with executor.kind "
        "parallel a worker that hits one is replaced and only its task fails")


@pytest.mark.slow  # a spawned worker, and its replacement
def test_a_worker_with_a_sticky_cuda_error_is_replaced_and_the_next_tasks_run():
    # one worker: task 1 breaks its CUDA context; tasks 2 and 3 run on a fresh worker
    ex = Executor(ExecutorConfig(kind="parallel", devices=1, threads_per_worker=1), "cpu")
    try:
        assert ex.parallel and ex.slots == [None]  # kind parallel with one slot: one worker
        out = dict((i, r) for i, _, r in ex.map([(_square_here, {"v": v, "sticky": v == 1}) for v in range(4)],
                                                tolerate=True))
        again = dict((i, r) for i, _, r in ex.map([(_square_here, {"v": v}) for v in range(4)]))  # none failing
    finally:
        ex.close()
    assert isinstance(out[1], TaskFailure) and out[1].reason.startswith(
        "AcceleratorError: CUDA error: an illegal memory access was encountered")
    assert ex.replaced_workers == 1
    first, fresh = out[0][1], out[2][1]
    assert first != fresh and out[3][1] == fresh == again[0][1]  # a new process ran every task after the failure
    # the stage's results are a run's without the failure, but for that client
    assert {i: r[0] for i, r in out.items() if i != 1} == {i: r[0] for i, r in again.items() if i != 1} == \
        {0: 0, 2: 4, 3: 9}


def _out_of_memory_once(flag: str, v: int):
    """Out of memory the first time (``flag`` does not exist yet), ``v * v`` after."""
    if not os.path.exists(flag):
        open(flag, "w").close()
        raise DeviceMemoryError("round 1, local training, client 0: the GPU ran out of memory at batch size 64")
    return v * v


def _out_of_memory_always():
    raise DeviceMemoryError("round 1, local training, client 0: the GPU ran out of memory at batch size 64")


@pytest.mark.slow  # two spawned workers, and their replacements
def test_an_out_of_memory_on_a_shared_device_is_tried_once_more_on_a_fresh_worker(tmp_path):
    # two workers on one device (as on a GPU with workers_per_device 2): a neighbour's peak may have caused it
    ex = Executor(ExecutorConfig(kind="parallel", devices=1, workers_per_device=2, threads_per_worker=1), "cpu")
    try:
        got = {i: r for i, _, r in ex.map([(_out_of_memory_once, {"flag": str(tmp_path / "a"), "v": 3}),
                                           (_square_here, {"v": 2})], tolerate=True)}
        assert got[0] == 9 and got[1][0] == 4
        assert (ex.retried_tasks, ex.replaced_workers) == (1, 1)
        with pytest.raises(DeviceMemoryError, match="the GPU ran out of memory at batch size 64"):  # twice: it stops
            list(ex.map([(_out_of_memory_always, {})], tolerate=True))
        assert ex.retried_tasks == 2
    finally:
        ex.close()

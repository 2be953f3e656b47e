"""Where work runs when GPUs are visible, checked on the CPU with a mocked GPU count: ``executor.kind: auto``
(parallel over every visible GPU), workers pinned to their GPU before they start, the GPU ``executor.devices: [1]``
names used with one slot, and ``compare --jobs`` pairs spread over the GPUs."""

import os
import re

import pytest
import torch

from cosmos_pl.compare.pairs import gpu_slots
from cosmos_pl.errors import ConfigError
from cosmos_pl.execution.devices import physical_gpu
from cosmos_pl.execution.executor import Executor, ExecutorConfig


@pytest.fixture
def gpus(monkeypatch):
    def visible(n: int, env: str | None = None) -> None:
        monkeypatch.setattr(torch.cuda, "device_count", lambda: n)
        if env is None:
            monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
        else:
            monkeypatch.setenv("CUDA_VISIBLE_DEVICES", env)
    return visible


def test_physical_gpu_follows_this_process_visible_devices(gpus):
    gpus(2)
    assert [physical_gpu(0), physical_gpu(1)] == ["0", "1"]
    gpus(2, "4,6")  # this process sees GPUs 4 and 6 as 0 and 1: a child pinned to our GPU 1 is given 6
    assert [physical_gpu(0), physical_gpu(1)] == ["4", "6"]
    gpus(1, "GPU-8f3a, ")
    assert physical_gpu(0) == "GPU-8f3a"


@pytest.mark.parametrize("kind, n_gpu, per_device, accelerator, parallel, slots", [
    ("auto", 0, 1, "auto", False, [None]),        # a CPU: one after another, as before
    ("auto", 1, 1, "auto", False, [0]),           # one GPU, one worker: in this process, on it
    ("auto", 1, 2, "auto", True, [0, 0]),         # one large GPU shared by two workers
    ("auto", 2, 1, "auto", True, [0, 1]),         # two GPUs: a worker on each
    ("auto", 8, 1, "auto", True, list(range(8))),
    ("auto", 2, 1, "cpu", False, [None]),         # trainer.accelerator cpu never uses the GPUs
    ("sequential", 2, 1, "auto", False, [0, 1]),  # asked for: one after another (on cuda:0)
    ("parallel", 0, 1, "auto", True, [None]),     # asked for: one worker, on the CPU too
])
def test_auto_executor_uses_every_visible_gpu(gpus, kind, n_gpu, per_device, accelerator, parallel, slots):
    gpus(n_gpu)
    ex = Executor(ExecutorConfig(kind=kind, workers_per_device=per_device), accelerator)
    assert (ex.parallel, ex.slots) == (parallel, slots)


def _nothing():
    return None


@pytest.mark.slow  # two spawned worker processes
def test_each_worker_is_pinned_to_its_gpu_from_its_start_and_checks_it(gpus):
    # this process is made to see 2 GPUs (98 and 99, ids no machine has); the workers start pinned to one each and
    # check what they see: none, so the first task stops the stage naming the worker's pinning
    gpus(2, "98,99")
    ex = Executor(ExecutorConfig(threads_per_worker=1), "auto")
    try:
        with pytest.raises(ConfigError) as err:
            list(ex.map([(_nothing, {}), (_nothing, {})], tolerate=True))  # never a client's failure
    finally:
        ex.close()
    assert re.fullmatch(r"executor: the worker for GPU (0 \(CUDA_VISIBLE_DEVICES=98\)|1 \(CUDA_VISIBLE_DEVICES=99\)) "
                        r"sees 0 GPUs, not 1: something in the environment resets CUDA_VISIBLE_DEVICES; give "
                        r"executor.devices GPU ids that exist", str(err.value)), str(err.value)
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "98,99"  # this process's own setting is left as it was


def _trainer_devices():
    """The accelerator and devices a stage's Trainer is given here (``pl.Trainer`` faked to return its arguments)."""
    from cosmos_pl.training.config import TrainerConfig
    from cosmos_pl.training.engine import make_trainer

    given = make_trainer(TrainerConfig(accelerator="auto"), epochs=1)
    return given["accelerator"], given["devices"]


@pytest.mark.gpu_path
@pytest.mark.parametrize("kind", ["auto", "sequential"])
def test_one_slot_on_gpu_1_trains_on_gpu_1_in_this_process(gpus, monkeypatch, restore_flags, kind):
    # executor.devices [1] with one worker per GPU (kind auto), or kind sequential: the tasks run in this process,
    # with GPU 1 as CUDA's current device, and every stage's Trainer is given that GPU (not cuda:0)
    import lightning.pytorch as pl

    gpus(2)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    current = [0]  # CUDA's current device, faked: this machine has no GPU

    class Device:  # torch.cuda.device(k): GPU k current while the block runs
        def __init__(self, k):
            self.k = k

        def __enter__(self):
            self.before, current[0] = current[0], self.k

        def __exit__(self, *exc):
            current[0] = self.before

    monkeypatch.setattr(torch.cuda, "device", Device)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: current[0])
    monkeypatch.setattr(pl, "Trainer", lambda **kwargs: kwargs)
    ex = Executor(ExecutorConfig(kind=kind, devices=[1], workers_per_device=1, threads_per_worker=1), "auto")
    got = [out for _, _, out in ex.map([(_trainer_devices, {}), (_trainer_devices, {})])]
    assert (ex.parallel, ex.slots) == (False, [1])
    assert got == [("gpu", [1]), ("gpu", [1])]
    assert current[0] == 0  # as it was, once the stage is over


@pytest.mark.gpu_path
def test_parallel_with_one_slot_on_gpu_1_starts_one_worker_pinned_to_it(gpus, spawned):
    gpus(2, "4,6")  # this process sees GPUs 4 and 6 as 0 and 1: a worker for our GPU 1 is given 6
    ex = Executor(ExecutorConfig(kind="parallel", devices=[1], threads_per_worker=1), "auto")
    assert (ex.parallel, ex.slots) == (True, [1])  # a pool of one worker, as kind parallel says
    ex._start()
    assert [(args[1], env.get("CUDA_VISIBLE_DEVICES")) for args, env in spawned] == [(1, "6")]
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "4,6"  # this process's own setting is left as it was


def test_compare_jobs_take_the_gpus_in_turn(gpus):
    gpus(2)
    assert gpu_slots(1, 2) == [None]  # one pair at a time sees every GPU (its executor spreads over them)
    assert gpu_slots(2, 2) == ["0", "1"]
    assert gpu_slots(2, 8) == ["0,2,4,6", "1,3,5,7"]
    assert gpu_slots(3, 2) == ["0", "1", "0"]  # more pairs than GPUs: they share
    assert gpu_slots(2, 0) == [None, None]  # no GPU: CPU cores only, split as before
    gpus(2, "4,6")
    assert gpu_slots(2, 2) == ["4", "6"]


GIB = 2 ** 30


def test_auto_workers_per_device_by_hand():
    from cosmos_pl.execution.devices import auto_workers_per_device, worker_gpu_bytes

    # 2 GPUs with 20 and 30 GiB free, 5 GiB a worker: 0.8 * 20 / 5 = 3.2 -> 3; 16 cores / 2 = 8; 25 tasks / 2 -> 13
    assert auto_workers_per_device([20 * GIB, 30 * GIB], 5 * GIB, cpus=16, tasks=25) == 3
    assert auto_workers_per_device([140 * GIB], 1 * GIB, cpus=16, tasks=25) == 4  # capped at 4 a GPU
    assert auto_workers_per_device([140 * GIB], 1 * GIB, cpus=3, tasks=25) == 3  # one core each
    assert auto_workers_per_device([140 * GIB] * 8, 1 * GIB, cpus=128, tasks=10) == 2  # 10 clients over 8 GPUs
    assert auto_workers_per_device([2 * GIB], 3 * GIB, cpus=16, tasks=25) == 1  # never fewer than one
    # cosmos-pl's VGG16 for 32 px and 100 classes (14,765,988 parameters) and U of 10,000 CIFAR images (30.72 MB)
    assert worker_gpu_bytes(14_765_988, 10_000 * 3072) == 600 * 2 ** 20 + 32 * 14_765_988 + 30_720_000


def test_auto_sizing_reads_free_memory_and_sets_the_slots(gpus, monkeypatch):
    import cosmos_pl.execution.devices as devices

    gpus(2)
    asked = []
    monkeypatch.setattr(devices, "gpu_free_bytes", lambda ids: asked.append(list(ids)) or [20 * GIB, 30 * GIB])
    monkeypatch.setattr(devices, "available_cpus", lambda: 16)
    ex = Executor(ExecutorConfig(), "auto")
    assert ex.workers_per_device == 1 and ex.slots == [0, 1]  # until sized
    # 1 GiB of parameters (32 bytes each) and 5 GiB in all: 0.8 * 20 / 5 -> 3 workers on each GPU
    line = ex.size_workers(parameters=GIB // 32, data_bytes=4 * GIB - devices.CUDA_CONTEXT_BYTES, tasks=25)
    assert asked == [[0, 1]] and ex.workers_per_device == 3 and ex.slots == [0, 1] * 3 and ex.parallel
    assert ex.threads == 2  # 16 cores over 6 workers
    assert line == ("executor: 3 worker(s) per GPU on 2 GPU(s) (workers_per_device auto: 20.0 GiB free on the fullest "
                    "GPU, about 5.00 GiB per worker, 16 CPU cores, 25 tasks per stage at most)")
    # a number given, the CPU, or kind sequential: nothing is sized
    for cfg, accelerator in ((ExecutorConfig(workers_per_device=2), "auto"), (ExecutorConfig(), "cpu"),
                             (ExecutorConfig(kind="sequential"), "auto")):
        ex = Executor(cfg, accelerator)
        slots = list(ex.slots)
        assert ex.size_workers(parameters=0, data_bytes=0, tasks=25) is None and ex.slots == slots


def test_auto_sizing_without_nvidia_smi_keeps_one_worker_per_gpu_and_says_so(gpus, monkeypatch):
    import cosmos_pl.execution.devices as devices

    gpus(2)
    monkeypatch.setattr(devices.shutil, "which", lambda name: None)
    ex = Executor(ExecutorConfig(), "auto")
    line = ex.size_workers(parameters=10, data_bytes=10, tasks=25)
    assert ex.slots == [0, 1] and "nvidia-smi did not answer" in line and "executor.workers_per_device" in line


def test_free_memory_is_read_per_gpu_and_the_least_where_gpu_models_differ(gpus, tmp_path, monkeypatch):
    from cosmos_pl.execution.devices import gpu_free_bytes

    gpus(2)
    fake = tmp_path / "nvidia-smi"
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)

    def smi(second: str) -> None:  # what nvidia-smi prints: every GPU, or the one -i names (MiB free)
        fake.write_text(f'#!/bin/sh\ncase "$*" in *"-i 1"*) echo "{second}, 30000";; *"-i 0"*) echo "H200, 20000";; '
                        f'*) printf "H200, 20000\\n{second}, 30000\\n";; esac\n')
        fake.chmod(0o755)

    smi("H200")
    assert gpu_free_bytes([0, 1]) == [20000 * 2 ** 20, 30000 * 2 ** 20]
    smi("RTX 4090")  # two models: CUDA's order may not be nvidia-smi's, so each gets the least
    assert gpu_free_bytes([0, 1]) == [20000 * 2 ** 20] * 2
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")  # the same order: each its own
    assert gpu_free_bytes([0, 1]) == [20000 * 2 ** 20, 30000 * 2 ** 20]
    fake.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed'; exit 9\n")
    assert gpu_free_bytes([0, 1]) is None


def test_more_threads_than_cores_is_warned_in_one_line_naming_the_setting_and_the_cores():
    from cosmos_pl.execution.devices import too_many_threads

    assert too_many_threads(None, 2) is None and too_many_threads(2, 2) is None
    assert too_many_threads(64, 2) == (
        "warning: executor.threads_per_worker=64 is more than this machine's 2 CPU core(s): each task's threads take "
        "turns on them, which can make a stage many times slower; give at most 2, or null to split the cores among "
        "the workers")

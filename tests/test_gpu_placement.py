"""Where work runs when GPUs are visible, checked on the CPU with a mocked GPU count: ``executor.kind: auto``
(parallel over every visible GPU), workers pinned to their GPU before they start, and ``compare --jobs`` pairs
spread over the GPUs."""

import os
import re

import pytest
import torch

from cosmos_pl.compare.pairs import gpu_slots
from cosmos_pl.errors import ConfigError
from cosmos_pl.federated.executor import Executor, ExecutorConfig, physical_gpu


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
    ("parallel", 0, 1, "auto", False, [None]),    # one CPU slot: nothing to spread
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


def test_compare_jobs_take_the_gpus_in_turn(gpus):
    gpus(2)
    assert gpu_slots(1, 2) == [None]  # one pair at a time sees every GPU (its executor spreads over them)
    assert gpu_slots(2, 2) == ["0", "1"]
    assert gpu_slots(2, 8) == ["0,2,4,6", "1,3,5,7"]
    assert gpu_slots(3, 2) == ["0", "1", "0"]  # more pairs than GPUs: they share
    assert gpu_slots(2, 0) == [None, None]  # no GPU: CPU cores only, split as before
    gpus(2, "4,6")
    assert gpu_slots(2, 2) == ["4", "6"]

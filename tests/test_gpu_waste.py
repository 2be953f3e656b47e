"""Work a GPU run does once instead of over and over, checked on the CPU with fakes (marked ``gpu_path``): a
training batch indexed on the data's device, U copied to the GPU once per process, each teacher's prior on U
computed once per round, no CUDA RNG touched in the main process, one Inductor compile thread per worker."""

import os
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import BatchSampler, DataLoader, RandomSampler

from cosmos_pl.data.federation import ClientData
from cosmos_pl.execution.executor import COMPILE_THREADS, Executor, ExecutorConfig
from cosmos_pl.federated.in_process import InProcessClients
from cosmos_pl.federated.runner import Runner
from cosmos_pl.objectives.runtime import ClientRuntime
from cosmos_pl.training import inference, resident
from cosmos_pl.training.client import Client
from cosmos_pl.training.config import RESIDENT_ATTR, TrainerConfig
from cosmos_pl.training.engine import Batches, loader
from cosmos_pl.training.inference import evaluate_models, predict_probs

pytestmark = pytest.mark.gpu_path

CPU = TrainerConfig(accelerator="cpu", channels_last=False)


# ---------------------------------------------------------------- training batches
def test_training_batches_keep_torchs_shuffle_and_are_indexed_on_the_datas_device():
    # 10 samples in batches of 4: the batches of a DataLoader over torch's RandomSampler under the same seed, and
    # the same draws from the global generator after them (the augmentations' randomness that follows is unchanged)
    data = torch.arange(10) * 10
    torch.manual_seed(7)
    torchs = DataLoader(Batches(data), sampler=BatchSampler(RandomSampler(range(10)), 4, False), batch_size=None)
    expected = [batch.tolist() for (batch,) in torchs]
    after = torch.rand(3)
    torch.manual_seed(7)
    got = [batch.tolist() for (batch,) in loader((data,), 4, shuffle=True)]
    assert got == expected and sorted(sum(got, [])) == data.tolist()
    assert [len(b) for b in got] == [4, 4, 2]
    torch.testing.assert_close(torch.rand(3), after)
    # 9 in batches of 4 drops the last batch of 1; in order: 0..n-1, no random draw
    assert [len(b) for (b,) in loader((data[:9],), 4, shuffle=True)] == [4, 4]
    assert [b.tolist() for (b,) in loader((data[:5],), 2, shuffle=False)] == [[0, 10], [20, 30], [40]]
    # on the data's device ("meta": a device every machine has), each batch's index is a slice of one order that
    # went there once for the epoch: no index copied to the device per step
    on_meta = loader((torch.zeros(10, 3, device="meta"),), 4, shuffle=True)
    indices = list(on_meta.sampler)
    assert [(i.device.type, i.dtype, len(i)) for i in indices] == [("meta", torch.int64, 4)] * 2 + \
        [("meta", torch.int64, 2)]
    assert all(i._base is indices[0]._base is not None for i in indices)
    assert [tuple(b.shape) for (b,) in on_meta] == [(4, 3), (4, 3), (2, 3)]


# ---------------------------------------------------------------- U on the GPU
class _HostU(torch.Tensor):
    """U as this process holds it: every copy to the faked GPU is counted; the copy stands in for the GPU's."""

    copies: list = []

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func is torch.Tensor.to:
            cls.copies.append(len(args[0]))
            with torch._C.DisableTorchFunctionSubclass():
                return args[0].clone()
        return super().__torch_function__(func, types, args, kwargs or {})


class _StaysPut(nn.Sequential):
    """A model that stays where it is when sent to the faked GPU."""

    def to(self, *args, **kwargs):
        return self


def test_u_crosses_to_the_gpu_once_per_process_for_every_inference_task_on_it(monkeypatch):
    monkeypatch.setattr(resident, "_DEVICE_COPIES", {})
    monkeypatch.setattr(_HostU, "copies", [])
    torch.manual_seed(0)
    plain = torch.randint(0, 256, (5, 1, 2, 2), dtype=torch.uint8)
    u = plain.clone().as_subclass(_HostU)
    setattr(u, RESIDENT_ATTR, "U")  # what the executor's transfer tags it with in a worker
    trainer = TrainerConfig(accelerator="cpu", channels_last=False, inference_batch_size=2)
    runtime = ClientRuntime(0, None, None, trainer, u, 3)
    model = _StaysPut(nn.Flatten(), nn.Linear(4, 3))
    clients = [SimpleNamespace(id=i, model=model) for i in range(2)]
    expected = predict_probs(model, plain, trainer)  # the same batches, from a plain U on the CPU
    monkeypatch.setattr(inference, "resolve_device", lambda accelerator: torch.device("cuda"))  # the faked GPU
    got = []
    for client in clients:  # two pseudo-label tasks of one stage in one worker: 3 batches each
        fn, kwargs = runtime.predict(client, rnd=1)
        got.append(fn(**kwargs))
    assert _HostU.copies == [5]  # U whole, once: not 3 batches of it per task
    for probs in got:
        assert torch.equal(probs, expected)


# ---------------------------------------------------------------- the teacher's prior on U
class _Fixed(nn.Module):
    """Probabilities ``on_u`` for a black image (U here), [0.6, 0.4] for a white one (the clients' test images);
    counts its forward passes over U."""

    def __init__(self, on_u) -> None:
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(1))
        self.on_u, self.passes_over_u = torch.tensor(on_u), 0

    def forward(self, x):
        white = (x.flatten(1).mean(1, keepdim=True) > 0).float()
        self.passes_over_u += int(white.sum() == 0)
        probs = white * torch.tensor([0.6, 0.4]) + (1 - white) * self.on_u
        return probs.log() + self.bias


def test_each_teachers_prior_on_u_is_computed_once_for_all_its_clients_and_splits():
    public = torch.zeros(6, 1, 2, 2, dtype=torch.uint8)  # black
    white = torch.full((4, 1, 2, 2), 255, dtype=torch.uint8)
    y_test = torch.tensor([1, 1, 1, 0])
    teachers = [_Fixed([0.5, 0.5]), _Fixed([0.1, 0.9])]  # K = 2 teachers for N = 4 clients
    data = [ClientData(white.repeat(2, 1, 1, 1), torch.ones(8, dtype=torch.long), white, y_test, np.array([0, 8]),
                       x_val=white, y_val=y_test) for _ in range(4)]  # training labels: 8 of class 1
    stages = []

    def run_tasks(rnd, stage, tasks, costs=None, trains=False, tolerate=False):  # the executor, in this process
        stages.append((stage, len(tasks)))
        return [(None, fn(**kwargs)) for fn, kwargs in tasks]

    runtime = ClientRuntime(0, None, None, CPU, public, 2)
    own = [nn.Sequential(nn.Flatten(), nn.Linear(4, 2)) for _ in range(4)]
    clients = InProcessClients(SimpleNamespace(clients=data), ["fixed"] * 4, own, runtime, None, "", run_tasks,
                               threads=1)
    models = {i: {"teacher": teachers[i // 2]} for i in range(4)}  # clients 0, 1: teacher 0; clients 2, 3: 1
    scores, _ = clients.end_round(1, models, evaluate=True)
    # one pass over U per teacher (before: one per client and split, 4 each)
    assert [t.passes_over_u for t in teachers] == [1, 1]
    assert stages == [("teacher priors", 2), ("evaluation", 8)]
    # by hand: the client's prior (8 + 1 of 10 for class 1) over the teacher's on U shifts [0.6, 0.4] to class 1
    # for teacher 0 ([0.5, 0.5]: 3 of 4 right), not for teacher 1 ([0.1, 0.9]: 0.06 / 0.1 > 0.36 / 0.9)
    assert {key: s["teacher_prior"]["top1"] for key, s in scores.items()} == {
        (i, split): 0.75 if i < 2 else 0.25 for i in range(4) for split in ("test", "val")}
    # the same scores as each evaluation computing the prior from U itself
    for (i, split), s in scores.items():
        assert s == evaluate_models({"client": clients.clients[i].model, "teacher": teachers[i // 2]}, white, y_test,
                                    2, CPU, class_counts=torch.tensor([0, 8]), public=public)


# ---------------------------------------------------------------- CUDA RNG in the main process
def test_the_servers_reference_weights_fork_the_cpu_rng_only(monkeypatch):
    # two GPUs, faked: forking every device's RNG would create a CUDA context on each in the main process
    touched = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_rng_state", lambda device="cuda": touched.append(device) or torch.zeros(1))
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda state, device="cuda": touched.append(device))

    def make_backbone(name, seed):
        torch.manual_seed(seed)
        return nn.Linear(2, 2)

    runner = SimpleNamespace(clients=SimpleNamespace(infos=[SimpleNamespace(backbone="tiny")]), _references={},
                             algorithm=SimpleNamespace(client_model=lambda model: model), make_backbone=make_backbone)
    before = torch.get_rng_state()
    weights = Runner.reference(runner, 0)
    assert touched == []
    assert set(weights) == {"weight", "bias"}
    assert torch.equal(torch.get_rng_state(), before)  # the CPU's random state is still kept apart


# ---------------------------------------------------------------- compiling in workers
def test_workers_start_with_one_compile_thread_and_this_process_keeps_its_environment(monkeypatch, spawned):
    monkeypatch.delenv(COMPILE_THREADS, raising=False)
    Executor(ExecutorConfig(kind="parallel", devices=2, threads_per_worker=1), "cpu")._start()
    started = lambda: [env.get(COMPILE_THREADS) for _, env in spawned]  # noqa: E731
    assert started() == ["1", "1"] and COMPILE_THREADS not in os.environ
    monkeypatch.setenv(COMPILE_THREADS, "3")  # the user's own setting is the workers' too
    Executor(ExecutorConfig(kind="parallel", devices=1, threads_per_worker=1), "cpu")._start()
    assert started()[2:] == ["3"] and os.environ[COMPILE_THREADS] == "3"


def _compile_threads():
    import torch._inductor.config

    return os.environ.get(COMPILE_THREADS), torch._inductor.config.compile_threads


@pytest.mark.slow  # a spawned worker process
def test_a_workers_inductor_compiles_with_one_thread(monkeypatch):
    monkeypatch.delenv(COMPILE_THREADS, raising=False)
    ex = Executor(ExecutorConfig(kind="parallel", devices=1, threads_per_worker=1), "cpu")
    try:
        assert [out for _, _, out in ex.map([(_compile_threads, {})])] == [("1", 1)]
    finally:
        ex.close()

"""How objects cross a worker's pipe (cosmos_pl.execution.pipe) and what a task's models become on the way
(cosmos_pl.execution.transfer): by value, no file descriptor left behind, strides and flags kept; a model of a known
architecture as its tensors' bytes, rebuilt from a template; a stage's shared model sent once per worker; the
resident data in one shared arena."""

import multiprocessing as mp
import os
import threading

import pytest
import torch
from torch import nn

from cosmos_pl.execution.pipe import Template, receive, send
from cosmos_pl.execution.transfer import (RESIDENT_ATTR, ForStage, Held, Residents, Skeleton, Weights, architecture,
                                          built, module_tensors, pack, repeated_models, trained_reply, unpack)


def _through_pipe(obj):
    """``obj`` sent over a real pipe and received (a thread reads while this one writes: big frames fill the
    socket buffer)."""
    a, b = mp.Pipe()
    got = []
    reader = threading.Thread(target=lambda: got.append(receive(b)))
    reader.start()
    try:
        send(a, obj)
        reader.join(timeout=30)
    finally:
        a.close()
        b.close()
    return got[0]


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_tensors_cross_by_value_with_dtype_shape_strides_and_flags():
    nchw = torch.arange(2 * 3 * 4 * 5, dtype=torch.float32).reshape(2, 3, 4, 5)
    last = nchw.contiguous(memory_format=torch.channels_last)  # strides (60, 1, 15, 3)
    frozen = nn.Parameter(torch.ones(3), requires_grad=False)
    tagged = torch.zeros(2)
    tagged.note = "kept"  # attributes set on a tensor travel with it, as in pickle's own way
    sent = {"last": last, "gappy": nchw[:, ::2], "bf16": torch.tensor([1.5, -2.0], dtype=torch.bfloat16),
            "bool": torch.tensor([True, False, True]), "scalar": torch.tensor(7, dtype=torch.int64),
            "empty": torch.empty(0, 4), "param": nn.Parameter(torch.full((2, 2), 3.0)), "frozen": frozen,
            "leaf": torch.ones(2, requires_grad=True), "tagged": tagged, "text": "not a tensor"}
    got = _through_pipe(sent)
    assert got["last"].stride() == (60, 1, 15, 3) and torch.equal(got["last"], nchw)
    # a view with gaps arrives as its values, contiguous (its stride (60, 40, 5, 1) is not kept)
    assert torch.equal(got["gappy"], nchw[:, ::2]) and got["gappy"].is_contiguous()
    assert got["bf16"].dtype == torch.bfloat16 and got["bf16"].tolist() == [1.5, -2.0]
    assert got["bool"].tolist() == [True, False, True] and got["scalar"].shape == () and int(got["scalar"]) == 7
    assert got["empty"].shape == (0, 4)
    assert type(got["param"]) is nn.Parameter and got["param"].requires_grad and float(got["param"].detach().sum()) == 12.0
    assert type(got["frozen"]) is nn.Parameter and not got["frozen"].requires_grad
    assert got["leaf"].requires_grad and got["leaf"].is_leaf
    assert got["tagged"].note == "kept" and got["text"] == "not a tensor"
    # each tensor's bytes land at a 64-byte boundary, as torch allocates them (some CPU kernels sum in another order
    # at another alignment)
    assert all(got[k].data_ptr() % 64 == 0 for k in ("last", "gappy", "bf16", "param", "leaf"))
    got["last"].add_(1)  # the received tensors own their memory: the sender's are untouched
    assert torch.equal(last, nchw)


def test_models_leave_no_descriptor_or_shared_memory_behind():
    model = nn.Sequential(*[nn.Sequential(nn.Conv2d(4, 4, 3), nn.BatchNorm2d(4)) for _ in range(20)])  # 120 tensors
    _through_pipe(model)  # the first use imports what pickling needs
    before = _open_fds()
    back = [_through_pipe(model) for _ in range(10)]
    assert _open_fds() == before  # torch's sharing would hold a descriptor per tensor: 120 per model here
    assert not any(t.is_shared() for m in back for t in m.state_dict().values())
    assert all(torch.equal(x, y) for x, y in zip(back[-1].state_dict().values(), model.state_dict().values()))


def test_a_tensor_in_shared_memory_goes_as_shared_memory():
    arena = torch.arange(6.0).share_memory_()
    got = _through_pipe({"x": arena})["x"]
    assert got.is_shared() and torch.equal(got, arena)
    got[0] = 100.0  # the same pages: what one process writes the other reads
    assert float(arena[0]) == 100.0


def _net(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(3, 300, 3), nn.BatchNorm2d(300), nn.Flatten(), nn.Linear(300, 2))


def test_a_template_rebuilds_a_model_from_its_tensors_bytes():
    a, b = _net(0), _net(1)
    b[1].running_mean += 3.0
    b[0].to(memory_format=torch.channels_last)
    template = Template(b, module_tensors(b))
    # the conv weight (300*3*3*3*4 = 32,400 bytes) shares the small buffer; nothing here reaches 64 KiB
    assert template.large == [] and len(template.small) == 9
    flat = template.flatten(module_tensors(b))
    assert len(flat) == 1 and flat[0].dtype == torch.uint8
    # every tensor once, each from a multiple of 64 bytes: the conv weight 32,400 -> 32,448 bytes, five 300-float
    # vectors 1,200 -> 1,216, the linear weight 2,400 -> 2,432, its bias (8) and num_batches_tracked (8) -> 64 each
    assert flat[0].numel() == 32448 + 5 * 1216 + 2432 + 2 * 64
    assert all(offset % 64 == 0 for offset, _ in template.offsets.values())
    rebuilt = template.build(flat)
    assert rebuilt is not b and rebuilt[0].weight.stride() == b[0].weight.stride()
    assert all(torch.equal(x, y) for x, y in zip(rebuilt.state_dict().values(), b.state_dict().values()))
    start = flat[0].data_ptr()  # the rebuilt tensors are views of the buffer, not copies
    assert start <= rebuilt[0].weight.data_ptr() < start + flat[0].numel()
    big = nn.Linear(200, 100)  # 80,000-byte weight: a frame of its own, sent from its memory
    template = Template(big, module_tensors(big))
    assert template.large == ["weight"] and template.small == ["bias"]
    flat = template.flatten(module_tensors(big))
    assert flat[1].data_ptr() == big.weight.data_ptr() and torch.equal(template.build(flat).weight, big.weight)
    del a


def test_a_model_goes_whole_once_then_as_its_tensors_and_is_rebuilt_equal_and_private():
    residents, held, templates, kept = Residents(), set(), {}, {}
    a, b = _net(0), _net(1)  # same architecture, other weights
    b[1].running_mean += 3.0  # a buffer
    first, new = pack({"model": a}, residents, held, templates)
    assert isinstance(first["model"], Skeleton) and new == [architecture(a)] and list(templates) == new
    held.update(new)
    got, sent = unpack(_through_pipe(first), kept)
    assert sent == architecture(a) and torch.equal(got["model"][0].weight, a[0].weight)
    second, new = pack({"models": {"client": b}}, residents, held, templates)
    assert isinstance(second["models"]["client"], Weights) and new == []
    rebuilt = unpack(_through_pipe(second), kept)[0]["models"]["client"]
    assert all(torch.equal(x, y) for x, y in zip(rebuilt.state_dict().values(), b.state_dict().values()))
    with torch.no_grad():
        rebuilt[0].weight.add_(1.0)
    assert not torch.equal(rebuilt[0].weight, b[0].weight)  # private: the sender's model is untouched
    # what the tensors do not carry makes another architecture: eval mode, a frozen parameter, another shape
    frozen = _net(2)
    frozen[3].weight.requires_grad_(False)
    names = {architecture(m) for m in (a, _net(3).eval(), frozen, nn.Sequential(nn.Linear(3, 5)))}
    assert len(names) == 4 and architecture(_net(4)) == architecture(a)


def test_a_trained_model_comes_back_as_its_tensors_while_its_architecture_holds():
    sent = _net(0)
    name = architecture(sent)
    kept = {name: Template(sent, module_tensors(sent))}
    templates = dict(kept)
    trained = _net(5)  # same architecture, trained weights
    reply = trained_reply(trained, name, kept)
    assert isinstance(reply, Weights)
    back = built(_through_pipe(reply), templates)
    assert all(torch.equal(x, y) for x, y in zip(back.state_dict().values(), trained.state_dict().values()))
    assert back.training and all(m.training for m in back.modules())
    trained.eval()  # the flags changed: the model comes back whole, flags and all
    whole = trained_reply(trained, name, kept)
    assert whole is trained and not built(_through_pipe(whole), templates).training


def test_a_model_several_tasks_read_goes_to_a_worker_once_per_stage():
    residents, held, templates, kept = Residents(), set(), {}, {}
    teacher, clients = _net(9), [_net(i) for i in range(3)]
    tasks = [(None, {"models": {"client": c, "teacher": teacher}}) for c in clients]
    repeated = repeated_models(tasks, trains=False)
    assert repeated == {id(teacher)}  # each client is read once: not kept
    got = []
    for _, kwargs in tasks:
        packed, new = pack(kwargs, residents, held, templates, stage=7, repeated=repeated)
        held.update(new)
        got.append(unpack(_through_pipe(packed), kept)[0])
        sent_teacher = packed["models"]["teacher"]
        assert isinstance(sent_teacher, ForStage if len(got) == 1 else Held)
    assert got[0]["models"]["teacher"] is got[2]["models"]["teacher"]  # one copy in the worker
    assert f"stage 7 {id(teacher)}" in kept
    # a model the tasks train is never kept for the stage, however many tasks name it
    assert repeated_models([(None, {"model": teacher})] * 2, trains=True) == frozenset()


def test_residents_move_into_one_shared_arena_keeping_identity_and_values():
    residents = Residents()
    x = torch.arange(12, dtype=torch.float32).reshape(3, 4)[:, :3]  # a non-contiguous view: 9 values
    y = torch.arange(100, dtype=torch.uint8)
    residents.add("client 0 x", x)
    residents.add("client 0 y", y)
    residents.add("client 0 y", y)  # again: nothing new
    assert residents.nbytes() == 64 + 128  # 36 bytes and 100 bytes, each from a multiple of 64
    assert residents.share() == 192 and residents.nbytes() == 0 and residents.share() == 0
    assert x.is_shared() and y.is_shared() and x.untyped_storage().data_ptr() == y.untyped_storage().data_ptr()
    assert x.tolist() == [[0, 1, 2], [4, 5, 6], [8, 9, 10]] and x.is_contiguous() and torch.equal(y, torch.arange(100,
                                                                                                  dtype=torch.uint8))
    assert getattr(x, RESIDENT_ATTR) == "client 0 x" and residents.name_of(x) == "client 0 x"
    assert residents.name_of(x.clone()) is None


# ----------------------------------------------------------------------------------------------- /dev/shm
def test_shared_memory_plan_by_hand():
    from cosmos_pl.errors import ConfigError
    from cosmos_pl.execution.devices import PRIVATE, SEQUENTIAL, SHARED, shared_memory_plan

    mib = 2 ** 20
    assert shared_memory_plan(90 * mib, 100 * mib, 4, explicit=True) == (SHARED, None)  # 90% of what is free fits
    assert shared_memory_plan(10 * mib, None, 4, explicit=True) == (SHARED, None)  # no /dev/shm: nothing to check
    mode, line = shared_memory_plan(91 * mib, 100 * mib, 4, explicit=False, available=1000 * mib)
    assert mode == PRIVATE and line == (
        "executor: the clients' data and U need about 91 MiB of shared memory (/dev/shm), and it has 100 MiB free: "
        "each of the 4 workers gets its own copy instead (about 364 MiB of memory in all); docker run --shm-size=1g "
        "lets them share one")
    mode, line = shared_memory_plan(300 * mib, 100 * mib, 4, explicit=False, available=2000 * mib)
    assert mode == SEQUENTIAL and line.startswith("executor: sequential, in this process:") and "1200 MiB" in line
    with pytest.raises(ConfigError) as err:
        shared_memory_plan(3 * 2 ** 30, 64 * mib, 8, explicit=True)
    assert str(err.value) == (
        "executor: 8 parallel workers were asked for, and the clients' data and U need about 3072 MiB of shared "
        "memory (/dev/shm), and it has 64 MiB free: give the container more (docker run --shm-size=6g), or leave "
        "executor.kind and executor.workers_per_device at auto (a copy per worker, or sequential), or use "
        "executor.kind sequential")


def test_an_executor_that_chose_its_gpu_workers_falls_back_where_shm_is_small(monkeypatch):
    from cosmos_pl.errors import ConfigError
    from cosmos_pl.execution import executor as executor_module
    from cosmos_pl.execution.executor import Executor, ExecutorConfig

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)  # two GPUs seen: auto is parallel, a worker each
    monkeypatch.setattr(executor_module, "shared_memory_free", lambda: 2 ** 20)
    monkeypatch.setattr(executor_module, "memory_available", lambda: 2 ** 30)
    ex = Executor(ExecutorConfig(), "auto")
    ex.keep_resident("U", torch.zeros(2 ** 20, dtype=torch.uint8))  # 1 MiB: more than 90% of 1 MiB
    line = ex.plan_shared_memory()
    assert ex.parallel and ex.shared_memory == "private" and "each of the 2 workers gets its own copy" in line
    monkeypatch.setattr(executor_module, "memory_available", lambda: 3 * 2 ** 20)  # 2 copies > half of 3 MiB
    ex = Executor(ExecutorConfig(threads_per_worker=1), "auto")
    ex.keep_resident("U", torch.zeros(2 ** 20, dtype=torch.uint8))
    assert ex.plan_shared_memory().startswith("executor: sequential") and not ex.parallel
    ex = Executor(ExecutorConfig(workers_per_device=1), "auto")  # a number given: the user's choice stands
    ex.keep_resident("U", torch.zeros(2 ** 20, dtype=torch.uint8))
    with pytest.raises(ConfigError, match="2 parallel workers were asked for"):
        ex.plan_shared_memory()


def _sum_of(x, model):
    return float(x.sum()) + float(model.weight.sum()), x.is_shared()


@pytest.mark.slow  # two spawned worker processes
def test_private_copies_give_the_same_results_as_the_shared_arena():
    from cosmos_pl.execution.executor import Executor, ExecutorConfig

    outputs = {}
    for mode in ("shared", "private"):
        ex = Executor(ExecutorConfig(kind="parallel", devices=2, threads_per_worker=1), "cpu")
        ex.shared_memory = mode
        x = torch.arange(10.0)
        ex.keep_resident("x", x)
        model = nn.Linear(3, 1, bias=False)
        with torch.no_grad():
            model.weight.fill_(2.0)
        try:
            outputs[mode] = sorted(out for _, _, out in ex.map([(_sum_of, {"x": x, "model": model})] * 4))
        finally:
            ex.close()
        assert x.is_shared() == (mode == "shared")  # in this process too: the arena, or where it was
    assert outputs == {"shared": [(51.0, True)] * 4, "private": [(51.0, False)] * 4}

"""Resident tensors (a client's data, U): each parallel worker is sent one once and keeps it across stages and
rounds; a stage on a GPU keeps one device copy of it per process."""

import gc

import pytest
import torch

from cosmos_pl.federated.executor import RESIDENT_ATTR, Executor, ExecutorConfig, _Held, _Keep, _unpack, _Worker
from cosmos_pl.training import stages


def test_a_resident_tensor_is_packed_whole_once_per_worker_then_by_name():
    ex = Executor(ExecutorConfig(), "cpu")
    u = torch.arange(4.0)
    ex.keep_resident("U", u)
    worker = _Worker(None, None, None)
    first, new = ex._pack(worker, {"x": u, "epochs": 2})
    assert first == {"x": _Keep("U", u), "epochs": 2} and new == ["U"]
    worker.held.update(new)
    second, new = ex._pack(worker, {"x": u})
    assert second == {"x": _Held("U")} and new == []
    assert ex._pack(_Worker(None, None, None), {"x": u})[0]["x"] == _Keep("U", u)  # another worker: whole again
    equal = torch.arange(4.0)  # equal values, another tensor: not resident, sent as it is
    assert ex._pack(worker, {"x": equal})[0]["x"] is equal
    with pytest.raises(ValueError, match="'U' already names another tensor"):
        ex.keep_resident("U", equal)

    # in the worker: kept on first sight, tagged with its name, looked up afterwards
    held = {}
    got = _unpack(first, held)
    assert got["x"] is u and held == {"U": u} and getattr(u, RESIDENT_ATTR) == "U" and got["epochs"] == 2
    assert _unpack(second, held)["x"] is u


def _total(x, y):
    return float(x.sum() + y.sum()), getattr(x, RESIDENT_ATTR, None)


@pytest.mark.slow  # two spawned worker processes
def test_workers_keep_resident_data_across_stages():
    ex = Executor(ExecutorConfig(kind="parallel", devices=2, threads_per_worker=1), "cpu")
    x, y = torch.arange(6.0), torch.ones(3)
    ex.keep_resident("client 0 x", x)
    tasks = [(_total, {"x": x, "y": y}) for _ in range(4)]
    try:
        for _ in range(3):  # three stages
            assert sorted(out for _, _, out in ex.map(tasks)) == [(18.0, "client 0 x")] * 4  # 0+1+...+5 + 3
    finally:
        ex.close()
    assert ex.resident_sends == 2  # the first two tasks went to the two idle workers; none was sent it again


def test_a_stage_keeps_one_device_copy_of_a_resident_tensor():
    meta = torch.device("meta")  # a device every machine has: copies without memory
    u = torch.zeros(3)
    setattr(u, RESIDENT_ATTR, "U")
    first = stages._to_device(u, meta)
    assert first.device == meta and stages._to_device(u, meta) is first  # the same copy, not a new one
    plain = torch.zeros(3)
    assert stages._to_device(plain, meta) is not stages._to_device(plain, meta)  # not resident: copied each time
    del u
    gc.collect()
    again = torch.ones(3)  # a new tensor under the same name (a later run in this process) gets its own copy
    setattr(again, RESIDENT_ATTR, "U")
    assert stages._to_device(again, meta) is not first

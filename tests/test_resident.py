"""What travels to parallel workers (cosmos_pl.execution.transfer): resident tensors (a client's data, U) once per
worker, kept across stages and rounds, as are model architectures; a stage on a GPU keeps one device copy of a
resident tensor per process. How models travel: tests/test_transfer.py."""

import gc

import pytest
import torch
from torch import nn

from cosmos_pl.execution.executor import Executor, ExecutorConfig
from cosmos_pl.execution.transfer import RESIDENT_ATTR, Held, Keep, Residents, pack, unpack
from cosmos_pl.training import engine


def test_a_resident_tensor_is_packed_whole_once_per_worker_then_by_name():
    residents = Residents()
    u = torch.arange(4.0)
    residents.add("U", u)
    held: set[str] = set()
    first, new = pack({"x": u, "epochs": 2}, residents, held, {})
    assert first == {"x": Keep("U", u), "epochs": 2} and new == ["U"]
    held.update(new)
    second, new = pack({"x": u}, residents, held, {})
    assert second == {"x": Held("U")} and new == []
    assert pack({"x": u}, residents, set(), {})[0]["x"] == Keep("U", u)  # another worker: whole again
    equal = torch.arange(4.0)  # equal values, another tensor: not resident, sent as it is
    assert pack({"x": equal}, residents, held, {})[0]["x"] is equal
    with pytest.raises(ValueError, match="'U' already names another tensor"):
        residents.add("U", equal)

    # in the worker: kept on first sight, tagged with its name, looked up afterwards
    kept: dict = {}
    got, sent = unpack(first, kept)
    assert got["x"] is u and kept == {"U": u} and getattr(u, RESIDENT_ATTR) == "U" and got["epochs"] == 2
    assert unpack(second, kept)[0]["x"] is u and sent is None  # no model in these tasks


def _total(x, y, model):
    return float(x.sum() + y.sum() + model.weight.sum()), getattr(x, RESIDENT_ATTR, None)


@pytest.mark.slow  # two spawned worker processes
def test_workers_keep_resident_data_and_architectures_across_stages():
    ex = Executor(ExecutorConfig(kind="parallel", devices=2, threads_per_worker=1), "cpu")
    x, y = torch.arange(6.0), torch.ones(3)
    ex.keep_resident("client 0 x", x)
    try:
        for stage in range(3):  # three stages, each with new weights in a model of one architecture
            model = nn.Linear(2, 1, bias=False)
            with torch.no_grad():
                model.weight.fill_(stage)
            tasks = [(_total, {"x": x, "y": y, "model": model}) for _ in range(4)]
            # 0+1+...+5, + 3, + 2 weights of the stage's value
            assert sorted(out for _, _, out in ex.map(tasks)) == [(18.0 + 2 * stage, "client 0 x")] * 4
    finally:
        ex.close()
    # the first two tasks went to the two idle workers, each with x and the architecture; nothing whole again
    assert ex.resident_sends == 4


def test_a_stage_keeps_one_device_copy_of_a_resident_tensor():
    meta = torch.device("meta")  # a device every machine has: copies without memory
    u = torch.zeros(3)
    setattr(u, RESIDENT_ATTR, "U")
    first = engine.to_device(u, meta)
    assert first.device == meta and engine.to_device(u, meta) is first  # the same copy, not a new one
    plain = torch.zeros(3)
    assert engine.to_device(plain, meta) is not engine.to_device(plain, meta)  # not resident: copied each time
    del u
    gc.collect()
    again = torch.ones(3)  # a new tensor under the same name (a later run in this process) gets its own copy
    setattr(again, RESIDENT_ATTR, "U")
    assert engine.to_device(again, meta) is not first


def test_the_stages_read_the_tag_the_transfer_writes():
    u = torch.zeros(2)
    Residents().add("U", u)  # tags it with RESIDENT_ATTR
    first = engine.to_device(u, torch.device("meta"))
    assert engine.to_device(u, torch.device("meta")) is first  # the stage saw the tag: one copy

"""The executor's tasks: results by index, failures reported, settings checked. That a parallel fit gives the
sequential one's numbers (every stage seeded by its id) is tests/test_user_machines.py's, under an open-file limit
of 1,024."""

import pytest

from cosmos_pl.execution.devices import resolve_devices
from cosmos_pl.execution.executor import Executor, ExecutorConfig
from cosmos_pl.execution.task_failure import TaskFailure


def _square(model=None, v=0):
    return v * v


@pytest.mark.slow
def test_parallel_map_returns_every_result_by_index():
    ex = Executor(ExecutorConfig(kind="parallel", devices=2, threads_per_worker=1))
    try:
        tasks = [(_square, {"v": v}) for v in range(5)]
        out = {i: r for i, _, r in ex.map(tasks, costs=[1, 5, 2, 4, 3])}
    finally:
        ex.close()
    assert out == {i: i * i for i in range(5)}


def test_device_settings_are_validated():
    with pytest.raises(ValueError, match="executor.devices"):
        resolve_devices(0)
    with pytest.raises(ValueError, match="executor.workers_per_device"):
        Executor(ExecutorConfig(workers_per_device=0))
    # with trainer.accelerator cpu, N devices are N CPU slots on any machine (a one-GPU machine included)
    assert resolve_devices(3, "cpu") == [None] * 3


def _misbehave(model=None, v=0, how="ok"):
    import os
    import signal
    import time

    if how == "raise":
        raise RuntimeError(f"task {v} failed")
    if how == "hang":
        time.sleep(60)
    if how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    return v * v


@pytest.mark.parametrize("kind", ["sequential", pytest.param("parallel", marks=pytest.mark.slow)])
def test_failing_tasks_are_reported_and_the_others_finish(kind):
    """An exception, a hang past the timeout and (parallel) a killed worker fail their task only."""
    ex = Executor(ExecutorConfig(kind=kind, devices=2, threads_per_worker=1), "cpu")
    hows = ["ok", "raise", "hang", "ok", "kill" if kind == "parallel" else "ok", "ok"]
    try:
        out = {i: r for i, _, r in ex.map([(_misbehave, {"v": v, "how": h}) for v, h in enumerate(hows)],
                                          tolerate=True, timeout_s=3)}
        # the pool still works after losing workers
        again = {i: r for i, _, r in ex.map([(_square, {"v": v}) for v in range(3)])}
    finally:
        ex.close()
    assert {i: r for i, r in out.items() if not isinstance(r, TaskFailure)} == \
        {i: i * i for i, h in enumerate(hows) if h == "ok"}
    assert "RuntimeError: task 1 failed" in out[1].reason
    assert "ran past failures.timeout_s = 3 s" in out[2].reason
    if kind == "parallel":
        assert "worker process running it died (exit code -9)" in out[4].reason
        assert ex.replaced_workers == 2  # the hung one and the killed one
    assert again == {0: 0, 1: 1, 2: 4}


def test_without_tolerate_the_task_error_stops_the_stage():
    ex = Executor(ExecutorConfig(kind="sequential"), "cpu")
    with pytest.raises(RuntimeError, match="task 0 failed"):
        list(ex.map([(_misbehave, {"v": 0, "how": "raise"})]))

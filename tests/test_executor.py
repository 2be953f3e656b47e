"""The parallel executor gives the same numbers as the sequential one (every stage seeded by its id)."""

import pytest

from cosmos_pl.cli import run
from cosmos_pl.federated.executor import Executor, ExecutorConfig, resolve_devices


def _square(model=None, v=0):
    return v * v


def test_sequential_and_parallel_digits_runs_give_identical_metrics(repo_root, tmp_path):
    cfg = str(repo_root / "configs/digits_smoke.yaml")
    runs = {}
    for kind in ("sequential", "parallel"):
        run_dir = tmp_path / kind
        run(["fit", "--config", cfg, "--run_dir", str(run_dir), "--wandb.mode", "disabled",
              "--executor.kind", kind, "--executor.devices", "2", "--executor.threads_per_worker", "1",
              # short epochs: the point is every stage of a PTC and an IFFT round, not accuracy
              "--clients.pretrain_epochs", "2", "--algorithm.init_args.ptc_epochs", "2"])
        runs[kind] = run_dir
    for name in ("metrics.csv", "clients.csv"):
        assert (runs["sequential"] / name).read_text() == (runs["parallel"] / name).read_text(), name


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

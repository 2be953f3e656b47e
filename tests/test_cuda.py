"""Checks that need a CUDA GPU (marked ``cuda``, skipped without one; ``pytest -m cuda`` runs only these): mixed
precision in training and inference, determinism, workers on two GPUs, sequential and parallel runs equal. Written
for a GPU machine; on this project's CPU machine they are skipped."""

import os

import pytest
import torch
from torch import nn

# cosmos-pl's modules (Lightning) are imported in the tests, not here: without CUDA every test is skipped, and
# benchmarks/gpu_check.sh --dry-run runs this module on a CPU, where these imports would be its whole cost
pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                         nn.Flatten(), nn.Linear(8, 5))


def _data(n=96):
    g = torch.Generator().manual_seed(0)
    return (torch.randint(0, 256, (n, 3, 16, 16), dtype=torch.uint8, generator=g),
            torch.randint(0, 5, (n,), generator=g))


@pytest.mark.parametrize("precision", ["bf16-mixed", "16-mixed"])
def test_mixed_precision_trains_and_predicts_on_the_gpu(precision):
    from cosmos_pl.objectives.local_fit import fit_supervised
    from cosmos_pl.training.config import TrainerConfig
    from cosmos_pl.training.inference import predict_probs
    from cosmos_pl.training.module import default_optimizer

    if precision == "bf16-mixed" and not torch.cuda.is_bf16_supported(including_emulation=False):
        pytest.skip("this GPU has no native bfloat16 (compute capability < 8.0; torch would emulate it)")
    x, y = _data()
    cfg = TrainerConfig(accelerator="cuda", precision=precision)
    model = _model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    fit_supervised(model, x, y, epochs=2, batch_size=32, optimizer=default_optimizer(1e-2), transformations=None,
                   trainer=cfg, seed=0)
    assert all(p.device.type == "cpu" for p in model.parameters())  # handed back on the CPU
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())  # it trained
    probs = predict_probs(model, x, cfg)
    assert probs.shape == (96, 5) and probs.dtype == torch.float32 and bool(torch.isfinite(probs).all())
    torch.testing.assert_close(probs.sum(1), torch.ones(96), rtol=0, atol=1e-5)


def test_deterministic_true_gives_identical_weights_twice(restore_flags):
    from cosmos_pl.objectives.local_fit import fit_supervised
    from cosmos_pl.training.config import TrainerConfig
    from cosmos_pl.training.module import default_optimizer

    x, y = _data()
    cfg = TrainerConfig(accelerator="cuda", deterministic=True)
    states = []
    for _ in range(2):
        model = _model()
        fit_supervised(model, x, y, epochs=2, batch_size=32, optimizer=default_optimizer(1e-2), transformations=None,
                       trainer=cfg, seed=1)
        states.append(model.state_dict())
    for k in states[0]:
        torch.testing.assert_close(states[0][k], states[1][k], rtol=0, atol=0)


def _seen():
    return os.environ.get("CUDA_VISIBLE_DEVICES"), torch.cuda.device_count(), torch.cuda.get_device_name(0)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_two_gpus_get_one_pinned_worker_each():
    from cosmos_pl.execution.executor import Executor, ExecutorConfig

    ex = Executor(ExecutorConfig(threads_per_worker=1), "auto")
    try:
        assert ex.parallel and ex.slots[:2] == [0, 1]
        got = {i: out for i, _, out in ex.map([(_seen, {}) for _ in ex.slots])}
    finally:
        ex.close()
    seen = [got[i] for i in range(len(ex.slots))]
    assert all(count == 1 for _, count, _ in seen)  # each worker sees exactly its own GPU
    assert len({visible for visible, _, _ in seen}) == len(ex.slots)  # and no two the same


def test_sequential_and_parallel_runs_on_the_gpu_give_identical_metrics_when_deterministic(repo_root, tmp_path):
    # the small digits run twice on the GPU under trainer.deterministic true: in this process, then in two workers
    # sharing the GPU; every metric the same (on the CPU the same holds without the flag: tests/test_executor.py)
    from conftest import small_digits_argv

    from cosmos_pl.cli import main

    runs = {}
    for kind, per_device in (("sequential", 1), ("parallel", 2)):
        runs[kind] = tmp_path / kind
        assert main(small_digits_argv(repo_root, runs[kind], "--trainer.accelerator", "cuda",
                                      "--trainer.deterministic", "true", "--executor.kind", kind,
                                      "--executor.workers_per_device", str(per_device))) == 0
    for name in ("metrics.csv", "clients.csv"):
        assert (runs["sequential"] / name).read_text() == (runs["parallel"] / name).read_text(), name

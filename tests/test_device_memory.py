"""A GPU out of memory stops the run with one line (never a client's failure); inference first retries at half the
batch; ``trainer.deterministic`` sets torch's numerics flags. Run on the CPU: the model raises
``torch.cuda.OutOfMemoryError`` itself, as a CUDA kernel would."""

import pytest
import torch
from torch import nn

from cosmos_pl.errors import DeviceMemoryError
from cosmos_pl.execution.executor import Executor, ExecutorConfig
from cosmos_pl.execution.task_failure import TaskFailure
from cosmos_pl.objectives.distill import fit_distillation
from cosmos_pl.objectives.local_fit import fit_supervised
from cosmos_pl.training.config import TrainerConfig, apply_determinism, inference_batch
from cosmos_pl.training.inference import predict_probs
from cosmos_pl.training.module import default_optimizer

CPU = TrainerConfig(accelerator="cpu", channels_last=False)


class _Small(nn.Sequential):
    """``[B, 1, 8, 8] -> [B, 3]``; raises CUDA out-of-memory for a batch larger than ``limit``."""

    def __init__(self, limit: int = 10**9, error: Exception = None) -> None:
        torch.manual_seed(0)
        super().__init__(nn.Flatten(), nn.Linear(64, 3))
        self.limit, self.sizes = limit, []
        self.error = error or torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    def forward(self, x):
        self.sizes.append(len(x))
        if len(x) > self.limit:
            raise self.error
        return super().forward(x)


def _data(n=40):
    g = torch.Generator().manual_seed(0)
    return (torch.randint(0, 256, (n, 1, 8, 8), dtype=torch.uint8, generator=g),
            torch.randint(0, 3, (n,), generator=g))


def test_training_out_of_memory_is_one_line_naming_the_stage_batch_and_settings():
    x, y = _data()
    with pytest.raises(DeviceMemoryError) as err:
        fit_supervised(_Small(limit=8), x, y, epochs=1, batch_size=16, optimizer=default_optimizer(1e-3),
                       transformations=None, trainer=CPU, seed=0, where="round 0, local training, client 4",
                       optimizer_key="clients.optimizer")
    assert str(err.value) == (
        "round 0, local training, client 4: the GPU ran out of memory at batch size 16 (trainer.precision=32-true); "
        "lower clients.batch_size, or train in trainer.precision=bf16-mixed, or run fewer workers per GPU "
        "(executor.workers_per_device)")
    # a teacher's stage names the teacher's batch size, and bf16 is not offered again under bf16
    bf16 = TrainerConfig(accelerator="cpu", channels_last=False, precision="bf16-mixed")
    with pytest.raises(DeviceMemoryError) as err:
        fit_distillation(_Small(limit=8), x, torch.full((40, 3), 1 / 3), epochs=1, batch_size=32,
                         optimizer=default_optimizer(1e-3), transformations=None, trainer=bf16, seed=0, lam=0.0,
                         num_views=1, where="round 1, teacher 2", optimizer_key="algorithm.init_args.teacher_optimizer")
    assert str(err.value) == (
        "round 1, teacher 2: the GPU ran out of memory at batch size 32 (trainer.precision=bf16-mixed); lower "
        "algorithm.init_args.teacher_batch_size, or run fewer workers per GPU (executor.workers_per_device)")


def test_inference_out_of_memory_retries_at_half_the_batch_with_the_same_outputs():
    x, _ = _data(40)
    cfg = TrainerConfig(accelerator="cpu", channels_last=False, inference_batch_size=32)
    expected = predict_probs(_Small(), x, cfg)
    model = _Small(limit=10)
    got = predict_probs(model, x, cfg)
    # the same model on the same images: equal up to float32 rounding (a matrix product's summation order, and so its
    # last bit, may depend on how many rows go through it at once)
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-7)
    # 32 fails, 16 fails, 8 fits: then the rest of U goes at 8 (40 = 5 x 8)
    assert model.sizes == [32, 16, 8, 8, 8, 8, 8]


@pytest.mark.gpu_path
def test_inference_retries_at_half_the_batch_when_cublas_cannot_allocate_and_stops_on_another_error():
    """A cuBLAS workspace that does not fit is out of memory as the allocator's is: the batch halves; an error that
    is not about memory is raised at once, at the first batch size."""
    x, _ = _data(40)
    cfg = TrainerConfig(accelerator="cpu", channels_last=False, inference_batch_size=32)
    cublas = RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`")
    model = _Small(limit=10, error=cublas)
    predict_probs(model, x, cfg)
    assert model.sizes == [32, 16, 8, 8, 8, 8, 8]
    other = _Small(limit=10, error=RuntimeError("mat1 and mat2 shapes cannot be multiplied"))
    with pytest.raises(RuntimeError, match="shapes cannot be multiplied"):
        predict_probs(other, x, cfg)
    assert other.sizes == [32]


def test_inference_batch_size_unset_is_128_on_the_cpu_and_1024_on_a_gpu_and_a_set_value_wins():
    x, _ = _data(300)
    model = _Small()
    predict_probs(model, x, TrainerConfig(accelerator="cpu", channels_last=False))
    assert model.sizes == [128, 128, 44]  # 300 = 128 + 128 + 44
    model = _Small()
    predict_probs(model, x, TrainerConfig(accelerator="cpu", channels_last=False, inference_batch_size=100))
    assert model.sizes == [100, 100, 100]
    assert inference_batch(TrainerConfig(), torch.device("cuda")) == 1024
    assert inference_batch(TrainerConfig(inference_batch_size=64), torch.device("cuda")) == 64


def test_inference_out_of_memory_at_batch_one_names_the_inference_batch_size():
    x, _ = _data(4)
    cfg = TrainerConfig(accelerator="cpu", channels_last=False, inference_batch_size=2)
    with pytest.raises(DeviceMemoryError) as err:
        predict_probs(_Small(limit=0), x, cfg, where="round 1, pseudo-labels on U, client 3")
    assert str(err.value).startswith("round 1, pseudo-labels on U, client 3: the GPU ran out of memory at batch "
                                     "size 1 (trainer.precision=32-true); lower trainer.inference_batch_size")


def _out_of_memory():
    raise DeviceMemoryError("round 0, local training, client 1: the GPU ran out of memory at batch size 64")


def _value(v):
    return v


def test_the_executor_never_turns_out_of_memory_into_a_client_failure():
    executor = Executor(ExecutorConfig(kind="sequential", threads_per_worker=1), "cpu")
    try:
        # an ordinary error, tolerated, is a TaskFailure; out of memory stops the stage even when tolerated
        got = list(executor.map([(_value, {"v": 1}), (int, {"x": "not a number"})], tolerate=True))
        assert got[0][2] == 1 and isinstance(got[1][2], TaskFailure)
        with pytest.raises(DeviceMemoryError):
            list(executor.map([(_value, {"v": 1}), (_out_of_memory, {})], tolerate=True))
    finally:
        executor.close()


@pytest.mark.parametrize("value, enabled, warn_only", [(True, True, False), ("warn", True, True),
                                                        (False, False, False)])
def test_deterministic_sets_torch_and_cudnn_flags(restore_flags, value, enabled, warn_only):
    apply_determinism(TrainerConfig(accelerator="cpu", deterministic=value))
    assert torch.are_deterministic_algorithms_enabled() is enabled
    assert torch.is_deterministic_algorithms_warn_only_enabled() is warn_only
    assert torch.backends.cudnn.deterministic is enabled
    assert torch.backends.cudnn.benchmark is False  # autotuning only on a GPU, and only when not deterministic


def test_a_deterministic_stage_trains_the_same_model_as_the_default(restore_flags):
    x, y = _data()
    models = []
    for value in (False, True):
        model = _Small()
        fit_supervised(model, x, y, epochs=2, batch_size=16, optimizer=default_optimizer(1e-2), transformations=None,
                       trainer=TrainerConfig(accelerator="cpu", channels_last=False, deterministic=value), seed=3)
        models.append(model.state_dict())
    for k in models[0]:
        torch.testing.assert_close(models[0][k], models[1][k], rtol=0, atol=0)
    assert not torch.equal(models[0]["1.weight"], _Small().state_dict()["1.weight"])  # it did train


# ----------------------------------------------------------------------------------- shared memory (/dev/shm)
def test_too_little_shared_memory_for_the_workers_asked_for_stops_before_round_0(monkeypatch, repo_root, tmp_path,
                                                                                    capsys):
    from cosmos_pl.cli import main
    from cosmos_pl.execution import executor

    monkeypatch.setattr(executor, "shared_memory_free", lambda: 2 ** 10)  # 1 KiB free in /dev/shm
    # parallel workers asked for: the run stops with one line before round 0 trains; a sequential one never asks
    run_dir = tmp_path / "run"
    assert main(["fit", "--config", str(repo_root / "configs/digits_smoke.yaml"), "--executor.kind", "parallel",
                 "--executor.devices", "2", "--run_dir", str(run_dir), "--wandb.mode", "disabled"]) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith("cosmos-pl: error: executor: 2 parallel workers were asked for, and the clients' data and "
                           "U need about ") and "it has 0 MiB free: give the container more (docker run " \
                                                    "--shm-size=1g)" in line
    assert not (run_dir / "checkpoints" / "round-0000.pt").exists()

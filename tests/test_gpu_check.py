"""benchmarks/gpu_check.sh: its dry run finishes on this CPU with the figures its header promises, and its GPU
monitor turns ``nvidia-smi`` samples into per-GPU peaks and means."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))

from gpu_monitor import GpuMonitor  # noqa: E402


def test_monitor_reports_each_gpus_peak_memory_and_mean_utilisation(tmp_path, monkeypatch):
    # a stand-in nvidia-smi printing 3 samples of 2 GPUs in the queried format (index, name, used, total, util)
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\nprintf '0, H200, 1000, 143771, 50\\n1, H200, 7, 143771, 0\\n"
                    "0, H200, 9000, 143771, 100\\n1, H200, 7, 143771, [N/A]\\n0, H200, 4000, 143771, 30\\n'\n"
                    "exec sleep 30\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    with GpuMonitor() as monitor:
        deadline = time.monotonic() + 20
        while len(monitor.samples[0]) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
    assert monitor.report() == [
        {"index": 0, "name": "H200", "peak_memory_mib": 9000.0, "total_memory_mib": 143771.0,
         "mean_utilisation_percent": 60.0, "samples": 3},  # (50 + 100 + 30) / 3
        {"index": 1, "name": "H200", "peak_memory_mib": 7.0, "total_memory_mib": 143771.0,
         "mean_utilisation_percent": 0.0, "samples": 2}]  # an [N/A] utilisation leaves its memory counted
    assert monitor.status == "ran"


def test_monitor_says_when_nvidia_smi_fails(tmp_path, monkeypatch):
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\necho 'Failed to initialize NVML: Driver/library version mismatch'\nexit 18\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    with GpuMonitor() as monitor:
        time.sleep(0.5)
    assert monitor.report() == []
    assert monitor.status == "failed: Failed to initialize NVML: Driver/library version mismatch"


def test_monitor_without_nvidia_smi_reports_no_gpu(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with GpuMonitor() as monitor:
        pass
    assert monitor.report() == [] and monitor.status == "nvidia-smi absent"


def test_standin_has_cifar100s_shape_and_one_pattern_per_class(tmp_path):
    from gpu_check import write_standin

    path = tmp_path / "s.npz"
    write_standin(path, train=300, test=100)
    with np.load(path) as z:
        assert z["x_train"].shape == (300, 32, 32, 3) and z["x_train"].dtype == np.uint8
        assert z["x_test"].shape == (100, 32, 32, 3) and list(z["y_train"][:3]) == [0, 1, 2]
        assert len(z["classes"]) == 100
        x, y = z["x_train"].astype(float), z["y_train"]
    # images of one class are nearer each other than to another class's (the pattern dominates the noise)
    same = np.abs(x[y == 0][0] - x[y == 0][1]).mean()
    other = np.abs(x[y == 0][0] - x[y == 1][0]).mean()
    assert same < other
    assert not list(tmp_path.glob("*.tmp*"))  # written atomically


@pytest.mark.slow
def test_dry_run_finishes_on_a_cpu_with_every_figure(repo_root, tmp_path):
    env = {**os.environ, "PY": sys.executable, "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run(["bash", str(BENCH / "gpu_check.sh"), "--dry-run", "--data-dir", str(tmp_path / "data"),
                           "--run-dir", str(tmp_path / "run")], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    assert figures["dry_run"] is True and figures["data"] == "stand-in: 1,000 + 200 16x16x3 images of 20 class patterns"
    assert figures["gpus"] == []
    assert figures["seconds_per_round"] > 0
    # 1,000 training images, U = 20% of them (200); 10 clients with the rest; one view besides the image (Eq. 1);
    # one epoch per stage (teacher_epochs 1 in the dry run)
    k = figures["clusters"]["K"]
    assert figures["images_per_round_by_stage"] == {"local training": 800, "pseudo-labels": 10 * 200,
                                                    "teacher distillation": k * 200 * 2,
                                                    "client distillation": 10 * 200 * 2}
    assert set(figures["images_per_second_by_stage"]) == set(figures["images_per_round_by_stage"])
    assert 1 <= k <= 10 and set(figures["final"]) == {"teacher_acc", "client_acc"}


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="needs a machine without CUDA")
def test_without_cuda_it_exits_2_with_the_reason_before_anything_runs(tmp_path, monkeypatch, capsys):
    from cosmos_pl.training import cuda_check
    from gpu_check import main

    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi, as on this machine
    monkeypatch.setattr(cuda_check, "DEVICE_NODE", str(tmp_path / "nvidia0"))
    assert main(["--check", "--data-dir", str(tmp_path / "data")]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "gpu_check: error: CUDA is not available: no NVIDIA GPU or driver found (nvidia-smi absent, no "
        f"{tmp_path / 'nvidia0'}); run where there is one (in a container: docker run --gpus all), or check the "
        "script alone on the CPU with --dry-run"]
    assert main(["--check", "--dry-run"]) == 0  # the dry run checks the script's logic on the CPU
    assert not (tmp_path / "data").exists()


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="needs a machine without CUDA")
def test_the_script_stops_before_the_cuda_tests_without_cuda(tmp_path):
    # the cuda tests would all be skipped here, and pytest would exit 0 as if they had passed
    env = {**os.environ, "PY": sys.executable}
    done = subprocess.run(["bash", str(BENCH / "gpu_check.sh"), "--data-dir", str(tmp_path / "data")], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and done.stdout == "", done.stdout[-2000:]
    [line] = done.stderr.splitlines()
    assert line.startswith("gpu_check: error: CUDA is not available: ")

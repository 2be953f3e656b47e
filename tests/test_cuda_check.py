"""Why CUDA is unusable, in one line with its fix (cosmos_pl.training.cuda_check), against stand-in ``nvidia-smi``
programs and torch builds; the line ``fit --trainer.accelerator gpu`` stops with here; the run's device line."""

from importlib.metadata import version

import pytest
import torch

from cosmos_pl.training import cuda_check
from cosmos_pl.training.cuda_check import cuda_unavailable_reason, describe_device, device_line, nvidia_smi_gpus

TORCH = torch.__version__.split("+")[0]
VISION = version("torchvision").split("+")[0]
CU126 = (f"`make demo TORCH_BACKEND=cu126`, or `pip install torch=={TORCH} torchvision=={VISION} --index-url "
         "https://download.pytorch.org/whl/cu126`")
RTX4090_550 = "0, GPU-4a1b, NVIDIA GeForce RTX 4090, 550.54.14, 8.9"


@pytest.fixture
def machine(tmp_path, monkeypatch):
    """A machine whose only ``nvidia-smi`` is the one ``machine(rows)`` writes, printing ``rows`` (none for
    ``machine(None)``), without /dev/nvidia0, with torch's CUDA build ``cuda`` (``machine(rows, cuda="12.6")``)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    monkeypatch.setattr(cuda_check, "DEVICE_NODE", str(tmp_path / "nvidia0"))

    def make(rows=None, cuda="13.0", script=None):
        monkeypatch.setattr(torch.version, "cuda", cuda)
        smi = bin_dir / "nvidia-smi"
        smi.unlink(missing_ok=True)
        if rows is not None or script is not None:
            body = script or "printf '%s\\n' " + " ".join(f"'{r}'" for r in rows)
            smi.write_text(f"#!/bin/sh\n{body}\n")
            smi.chmod(0o755)

    return make


def test_a_driver_older_than_the_cuda13_wheel_names_both_versions_and_the_cuda12_build(machine):
    machine([RTX4090_550], cuda="13.0")
    assert cuda_unavailable_reason() == (
        f"the NVIDIA driver 550.54.14 is too old for torch {torch.__version__}, a CUDA 13.0 build that needs driver "
        f">= 580 (nvidia-smi lists 1 GPU: NVIDIA GeForce RTX 4090); install a torch built for CUDA 12 ({CU126}) or "
        "update the NVIDIA driver to >= 580")


def test_a_blackwell_gpu_is_told_to_update_the_driver_not_to_take_cuda_12_6(machine):
    machine(["0, GPU-1, NVIDIA GeForce RTX 5090, 575.51.02, 12.0"], cuda="13.0")
    line = cuda_unavailable_reason()
    assert line.endswith("; update the NVIDIA driver to >= 580 (torch's CUDA 12.6 build has no kernels for compute "
                         "capability 12.0)")
    assert "cu126" not in line


def test_a_driver_too_old_for_cuda_12_too_needs_a_new_driver(machine):
    machine(["0, GPU-1, Tesla V100-SXM2-16GB, 470.82.01, 7.0"], cuda="13.0")
    assert cuda_unavailable_reason().endswith(
        f"needs driver >= 580 (nvidia-smi lists 1 GPU: Tesla V100-SXM2-16GB); update the NVIDIA driver to >= 580 "
        f"(or >= 525 with a torch built for CUDA 12: {CU126})")


def test_a_new_enough_driver_gives_torchs_own_reason(machine, monkeypatch):
    machine([RTX4090_550, "1, GPU-4a1c, NVIDIA GeForce RTX 4090, 550.54.14, 8.9"], cuda="12.6")
    monkeypatch.setattr(cuda_check, "_torch_warning", lambda: "CUDA driver initialization failed (999)")
    assert cuda_unavailable_reason() == (
        "nvidia-smi lists 2 GPUs: NVIDIA GeForce RTX 4090 (driver 550.54.14, new enough for torch "
        f"{torch.__version__}'s CUDA 12.6) but torch could not initialise CUDA: CUDA driver initialization failed "
        "(999); see `python -c 'import torch; torch.cuda.init()'`, or use trainer.accelerator cpu")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert cuda_unavailable_reason().startswith("CUDA_VISIBLE_DEVICES='' hides every GPU (nvidia-smi lists 2 GPUs")


def test_torchs_warning_is_trimmed_to_its_reason():
    said = ("CUDA initialization: The NVIDIA driver on your system is too old (found version 12040). Please update "
            "your GPU driver.\n (Triggered internally at /pytorch/c10/cuda/CUDAFunctions.cpp:119.)")
    assert cuda_check._trim_warning(said) == ("The NVIDIA driver on your system is too old (found version 12040). "
                                              "Please update your GPU driver.")


def test_no_nvidia_smi_and_no_device_is_no_gpu(machine):
    machine(None, cuda="13.0")
    assert nvidia_smi_gpus().status == "absent"
    assert cuda_unavailable_reason() == (
        f"no NVIDIA GPU or driver found (nvidia-smi absent, no {cuda_check.DEVICE_NODE}); run where there is one "
        "(in a container: docker run --gpus all), or use trainer.accelerator cpu")


def test_a_cpu_only_torch_says_so_and_which_cuda_build_the_driver_takes(machine):
    machine(None, cuda=None)
    assert cuda_unavailable_reason().startswith(f"torch {torch.__version__} is a CPU-only build, and no NVIDIA GPU "
                                                "or driver was found (nvidia-smi absent); on a machine with one, "
                                                "install a CUDA build of torch (`make demo TORCH_BACKEND=auto`")
    machine([RTX4090_550], cuda=None)
    assert cuda_unavailable_reason() == (
        f"torch {torch.__version__} is a CPU-only build (nvidia-smi lists 1 GPU: NVIDIA GeForce RTX 4090; driver "
        f"550.54.14); install a CUDA build of torch ({CU126}), or use trainer.accelerator cpu")


def test_a_failing_nvidia_smi_is_quoted(machine):
    machine(script="echo \"NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\"; exit 9")
    assert cuda_unavailable_reason().startswith(
        "nvidia-smi fails (NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.): the NVIDIA "
        "driver is not working")


def test_an_old_nvidia_smi_without_compute_cap_is_asked_again_without_it(machine):
    machine(script='case "$1" in *compute_cap*) echo \'Field "compute_cap" is not a valid field to query.\'; exit 2;; '
                   "esac; echo '0, GPU-9, Tesla T4, 470.57.02'")
    smi = nvidia_smi_gpus()
    assert smi.status == "ok" and [(g.name, g.driver, g.capability) for g in smi.gpus] == [
        ("Tesla T4", "470.57.02", None)]


def test_the_device_line_names_the_gpus_driver_torch_and_precision(machine, monkeypatch):
    machine(["0, GPU-a, NVIDIA GeForce RTX 4090, 575.57.08, 8.9", "1, GPU-b, NVIDIA GeForce RTX 4090, 575.57.08, 8.9",
             "2, GPU-c, NVIDIA GeForce RTX 4090, 575.57.08, 8.9"], cuda="12.6")
    info = describe_device("gpu", "bf16-mixed", [(0, "0"), (1, "2")])
    assert device_line(info) == (f"device: 2 x NVIDIA GeForce RTX 4090 (GPUs 0, 1; driver 575.57.08; torch "
                                 f"{torch.__version__}, CUDA 12.6), precision bf16-mixed")
    assert info["gpus"] == ["NVIDIA GeForce RTX 4090"] * 2 and info["gpu_ids"] == [0, 1]


def test_auto_on_the_cpu_says_why_listed_gpus_are_not_used(machine, monkeypatch):
    machine([RTX4090_550], cuda="13.0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    line = device_line(describe_device("auto", "16-mixed", cpu_cores=8))
    assert line == (f"device: CPU (8 cores; torch {torch.__version__}; trainer.accelerator auto: the NVIDIA driver "
                    f"550.54.14 is too old for torch {torch.__version__}, a CUDA 13.0 build that needs driver >= 580 "
                    f"(nvidia-smi lists 1 GPU: NVIDIA GeForce RTX 4090); install a torch built for CUDA 12 ({CU126}) "
                    "or update the NVIDIA driver to >= 580), precision 16-mixed (on the CPU: training in bf16-mixed, "
                    "inference in 32-true)")
    machine(None)  # no nvidia-smi: nothing to explain
    assert device_line(describe_device("auto", "32", cpu_cores=1)) == (
        f"device: CPU (1 core; torch {torch.__version__}), precision 32-true")


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_fit_asking_for_the_gpu_here_stops_with_one_line_naming_the_reason_and_the_fix(machine, repo_root, tmp_path,
                                                                                        capsys):
    from cosmos_pl.cli import main

    machine(None, cuda=torch.version.cuda)  # this machine: no nvidia-smi
    run_dir = tmp_path / "run"
    assert main(["fit", "--config", str(repo_root / "configs/digits_smoke.yaml"), "--trainer.accelerator", "gpu",
                 "--run_dir", str(run_dir)]) == 2
    out = capsys.readouterr()
    assert out.err.splitlines() == [
        "cosmos-pl: error: trainer.accelerator='gpu': CUDA is not available: no NVIDIA GPU or driver found "
        f"(nvidia-smi absent, no {cuda_check.DEVICE_NODE}); run where there is one (in a container: docker run "
        "--gpus all), or use trainer.accelerator cpu"]
    assert out.out == "" and not run_dir.exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_resolve_device_gives_the_same_reason(machine):
    from cosmos_pl.training.config import resolve_device

    machine(None, cuda=torch.version.cuda)
    with pytest.raises(ValueError, match=r"^trainer.accelerator='cuda': CUDA is not available: no NVIDIA GPU or "
                                         r"driver found \(nvidia-smi absent"):
        resolve_device("cuda")
    assert resolve_device("auto") == torch.device("cpu")

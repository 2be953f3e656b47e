"""The GPU settings a run resolves before round 0, checked on the CPU with faked CUDA facts (marked ``gpu_path``):
the precision for given compute capabilities, kernels in the torch build, cuDNN autotuning off unless asked, what
summary.json records of the device, the round-0 key on a GPU, and backbones deterministic training cannot run."""

import json

import pytest
import torch
from test_cuda_check import machine  # noqa: F401  (a fixture: a stand-in nvidia-smi)

from cosmos_pl.errors import ConfigError
from cosmos_pl.training import config as training_config
from cosmos_pl.training.config import TrainerConfig, apply_determinism, autotuning
from cosmos_pl.training.cuda_check import GpuFacts, check_kernels, choose_precision, cudnn_version, describe_device

pytestmark = pytest.mark.gpu_path

NO_BF16 = ("has no native bfloat16 (compute capability 8.0 or newer: A100, RTX 30xx, L4, H100 and later)")
# torch 2.14.1+cu130's torch.cuda.get_arch_list() on x86_64
CU130_ARCHS = ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"]
RTX4090 = "NVIDIA GeForce RTX 4090"


# ---------------------------------------------------------------- the precision for given compute capabilities
@pytest.mark.parametrize("gpus", [
    [GpuFacts(0, "NVIDIA A100-SXM4-80GB", 8.0)],
    [GpuFacts(0, RTX4090, 8.9), GpuFacts(1, RTX4090, 8.9)],
    [GpuFacts(0, "NVIDIA H100 80GB HBM3", 9.0)],
    [GpuFacts(0, None, None)],  # capability unknown: not refused
])
@pytest.mark.parametrize("fallback", [None, "16-mixed"])
def test_bf16_mixed_runs_as_asked_on_gpus_from_compute_capability_8_0(gpus, fallback):
    assert choose_precision("bf16-mixed", fallback, gpus) == ("bf16-mixed", "")


def test_bf16_mixed_on_a_t4_takes_the_fallback_with_one_line():
    assert choose_precision("bf16-mixed", "16-mixed", [GpuFacts(0, "Tesla T4", 7.5)]) == (
        "16-mixed", f"precision: 16-mixed instead of bf16-mixed (trainer.precision_fallback): GPU 0 (Tesla T4, "
                    f"compute capability 7.5) {NO_BF16}")


def test_bf16_mixed_on_a_t4_without_a_fallback_is_refused_naming_the_gpu_and_the_fix():
    with pytest.raises(ConfigError) as err:
        choose_precision("bf16-mixed", None, [GpuFacts(0, "Tesla T4", 7.5), GpuFacts(1, "Tesla T4", 7.5)])
    assert str(err.value) == (
        f"trainer.precision='bf16-mixed': GPUs 0, 1 (Tesla T4, compute capability 7.5) {NO_BF16}, so torch would "
        "emulate it, slowly, or find no kernel; use trainer.precision 16-mixed (or 32-true), or let such a GPU run "
        "another with trainer.precision_fallback 16-mixed")


def test_mixed_gpus_a_t4_beside_an_a10_all_take_the_fallback_naming_the_t4_only():
    gpus = [GpuFacts(0, "Tesla T4", 7.5), GpuFacts(1, "NVIDIA A10", 8.6)]
    assert choose_precision("bf16-mixed", "16-mixed", gpus) == (
        "16-mixed", f"precision: 16-mixed instead of bf16-mixed (trainer.precision_fallback): GPU 0 (Tesla T4, "
                    f"compute capability 7.5) {NO_BF16}")
    with pytest.raises(ConfigError, match=r"^trainer.precision='bf16-mixed': GPU 0 \(Tesla T4, compute capability "
                                          r"7.5\) has no native"):
        choose_precision("bf16-mixed", None, gpus)


@pytest.mark.parametrize("precision", ["16-mixed", "32-true"])
def test_other_precisions_run_as_asked_on_a_t4(precision):
    assert choose_precision(precision, None, [GpuFacts(0, "Tesla T4", 7.5)]) == (precision, "")


# ---------------------------------------------------------------- kernels in the torch build
@pytest.mark.parametrize("capability", [7.5, 8.0, 8.6, 8.9, 9.0, 10.0, 12.0])
def test_gpus_the_cuda13_build_has_kernels_for_pass(capability):
    check_kernels([GpuFacts(0, "a GPU", capability)], CU130_ARCHS, "gpu")


def test_a_v100_with_the_cuda13_build_is_refused_with_the_cuda12_build_to_install(monkeypatch):
    from test_cuda_check import CU126

    monkeypatch.setattr(torch.version, "cuda", "13.0")
    with pytest.raises(ConfigError) as err:
        check_kernels([GpuFacts(0, "Tesla V100-SXM2-16GB", 7.0), GpuFacts(1, RTX4090, 8.9)], CU130_ARCHS, "gpu")
    assert str(err.value) == (
        f"trainer.accelerator='gpu': torch {torch.__version__} has no kernels for GPU 0 (Tesla V100-SXM2-16GB, "
        "compute capability 7.0) (it is built for sm_75 sm_80 sm_86 sm_90 sm_100 sm_120); install torch's CUDA 12.6 "
        f"build, which has kernels for it ({CU126}), or use trainer.accelerator cpu")


def test_an_unknown_arch_list_refuses_nothing():
    check_kernels([GpuFacts(0, "Tesla V100-SXM2-16GB", 7.0)], [], "auto")


# ---------------------------------------------------------------- cuDNN autotuning: off unless asked
@pytest.fixture
def on_a_gpu(monkeypatch, restore_flags):
    """Stages resolve their device to CUDA (nothing runs on it)."""
    monkeypatch.setattr(training_config, "resolve_device", lambda accelerator: torch.device("cuda"))


def test_the_default_on_a_gpu_does_not_autotune(on_a_gpu):
    apply_determinism(TrainerConfig(accelerator="cuda"))
    assert torch.backends.cudnn.benchmark is False and torch.backends.cudnn.deterministic is False
    apply_determinism(TrainerConfig(accelerator="cuda", benchmark=True))
    assert torch.backends.cudnn.benchmark is True


def test_autotuning_runs_only_when_asked_on_a_gpu_without_deterministic():
    assert [autotuning(b, d, t) for b, d, t in [(True, False, "cuda"), (False, False, "cuda"), (True, False, "cpu"),
                                                 (True, True, "cuda"), (True, "warn", "cuda")]] == [
        True, False, False, False, False]


@pytest.mark.parametrize("deterministic", [True, "warn"])
def test_benchmark_with_deterministic_is_refused(deterministic):
    with pytest.raises(ConfigError, match=r"^trainer.benchmark=True: cuDNN autotuning picks algorithms by timing, "
                                          r"which trainer.deterministic="):
        TrainerConfig(benchmark=True, deterministic=deterministic)


# ---------------------------------------------------------------- what summary.json records of the device
def test_the_device_record_on_gpus_has_models_capabilities_versions_and_flags(machine):  # noqa: F811
    machine([f"0, GPU-a, {RTX4090}, 575.57.08, 8.9", f"1, GPU-b, {RTX4090}, 575.57.08, 8.9"], cuda="12.6")
    info = describe_device("gpu", "bf16-mixed", [(0, "0"), (1, "1")], deterministic=True)
    assert info == {"accelerator": "gpu", "type": "cuda", "torch": torch.__version__, "cuda": "12.6",
                    "precision": "bf16-mixed", "deterministic": True, "benchmark": False, "gpu_ids": [0, 1],
                    "gpus": [RTX4090] * 2, "capabilities": [8.9, 8.9], "driver": "575.57.08",
                    "cudnn": cudnn_version()}
    assert describe_device("gpu", "32-true", [(0, "0")], benchmark=True)["benchmark"] is True


def test_the_cudnn_version_is_torchs_and_read_without_initialising_cuda(monkeypatch):
    expected = torch.backends.cudnn.version()  # no CUDA here: it asks no GPU
    # as at torch.backends.cudnn.version()'s first call in a process with CUDA, where it asks every GPU's capability
    module = getattr(torch.backends.cudnn, "m", torch.backends.cudnn)  # the module behind torch's wrapper
    monkeypatch.setitem(vars(module), "__cudnn_version", None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert cudnn_version() == expected and not torch.cuda.is_initialized()


def test_the_device_record_on_the_cpu_has_the_gpu_entries_null(machine):  # noqa: F811
    machine(None)
    info = describe_device("cpu", "32-true", cpu_cores=2)
    assert info == {"accelerator": "cpu", "type": "cpu", "torch": torch.__version__, "cuda": torch.version.cuda,
                    "precision": "32-true", "deterministic": False, "benchmark": False, "cpu_cores": 2,
                    "gpu_ids": None, "gpus": None, "capabilities": None, "driver": None, "cudnn": None}


def _fit_args(repo_root, *extra):
    return ["--config", str(repo_root / "configs/digits_smoke.yaml"), "--run_dir", "unused", *extra]


@pytest.fixture
def cuda_here(machine, monkeypatch):  # noqa: F811
    """This process believes it has CUDA with the GPUs of a stand-in ``nvidia-smi`` (``cuda_here(rows)``), and a
    torch build for sm_75 and newer."""
    def make(rows):
        machine(rows, cuda="13.0")
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: len(rows))
        monkeypatch.setattr(torch.cuda, "get_arch_list", lambda: list(CU130_ARCHS))

    return make


def test_fit_runs_every_stage_in_the_fallback_on_a_t4_and_records_it(cuda_here, repo_root):
    from cosmos_pl.fit import _device
    from cosmos_pl.parsers import build_fit_parser

    cuda_here(["0, GPU-a, Tesla T4, 580.65.06, 7.5"])
    parser = build_fit_parser()
    init = parser.instantiate(parser.parse_args(_fit_args(
        repo_root, "--trainer.accelerator", "gpu", "--trainer.precision", "bf16-mixed",
        "--trainer.precision_fallback", "16-mixed")))
    info = _device(init)
    assert init.trainer.precision == "16-mixed" == info["precision"]  # what the runner hands every stage
    assert info["precision_note"].startswith("precision: 16-mixed instead of bf16-mixed")
    assert (info["gpus"], info["capabilities"], info["deterministic"], info["benchmark"]) == (
        ["Tesla T4"], [7.5], False, False)
    init = parser.instantiate(parser.parse_args(_fit_args(repo_root, "--trainer.accelerator", "gpu",
                                                          "--trainer.benchmark", "true")))
    assert _device(init)["benchmark"] is True  # autotuning asked for, on a GPU
    init = parser.instantiate(parser.parse_args(_fit_args(repo_root, "--trainer.benchmark", "true")))
    assert _device(init)["benchmark"] is False  # digits_smoke's accelerator cpu: never autotuned


# ---------------------------------------------------------------- checks before round 0
@pytest.mark.parametrize("extra, message", [
    (["--trainer.precision", "bf16-mixed"],
     f"trainer.precision='bf16-mixed': GPU 0 (Tesla T4, compute capability 7.5) {NO_BF16}, so torch would"),
    (["--trainer.deterministic", "true", "--algorithm.init_args.teacher_backbone", "alexnet"],
     "algorithm.init_args.teacher_backbone: alexnet has AdaptiveAvgPool2d(output_size=(2, 2)), which torch cannot "
     "train deterministically on a GPU (with trainer.deterministic=True its backward raises); use "
     "trainer.deterministic warn (deterministic wherever torch can be, with a warning at that layer), another "
     "backbone, or trainer.accelerator cpu"),
], ids=["bf16 on a T4", "alexnet deterministic"])
def test_validate_config_refuses_what_the_gpu_cannot_run(cuda_here, repo_root, extra, message):
    from cosmos_pl.config import validate_config
    from cosmos_pl.parsers import build_fit_parser

    cuda_here(["0, GPU-a, Tesla T4, 580.65.06, 7.5"])
    parser = build_fit_parser()
    init = parser.instantiate(parser.parse_args(_fit_args(repo_root, "--trainer.accelerator", "gpu", *extra)))
    with pytest.raises(ConfigError) as err:
        validate_config(init)
    assert str(err.value).startswith(message)


@pytest.mark.parametrize("extra", [
    ["--trainer.precision", "bf16-mixed", "--trainer.precision_fallback", "16-mixed"],
    ["--trainer.deterministic", "warn", "--algorithm.init_args.teacher_backbone", "alexnet"],
    ["--trainer.deterministic", "true"],  # the config's own backbones train deterministically
], ids=["bf16 with a fallback", "alexnet warn", "deterministic"])
def test_validate_config_lets_the_gpu_run_what_it_can(cuda_here, repo_root, extra):
    from cosmos_pl.config import validate_config
    from cosmos_pl.parsers import build_fit_parser

    cuda_here(["0, GPU-a, Tesla T4, 580.65.06, 7.5"])
    parser = build_fit_parser()
    validate_config(parser.instantiate(parser.parse_args(_fit_args(repo_root, "--trainer.accelerator", "gpu",
                                                                   *extra))))


def test_validate_config_refuses_a_gpu_without_kernels(cuda_here, repo_root):
    from cosmos_pl.config import validate_config
    from cosmos_pl.parsers import build_fit_parser

    cuda_here(["0, GPU-a, Tesla V100-SXM2-16GB, 580.65.06, 7.0"])
    parser = build_fit_parser()
    with pytest.raises(ConfigError, match=r"^trainer.accelerator='gpu': torch \S+ has no kernels for GPU 0 \(Tesla "
                                          r"V100-SXM2-16GB, compute capability 7.0\)"):
        validate_config(parser.instantiate(parser.parse_args(_fit_args(repo_root, "--trainer.accelerator", "gpu"))))


# ---------------------------------------------------------------- the round-0 key on a GPU
def test_the_round0_key_on_a_gpu_names_its_model_and_the_torch_and_cudnn_versions(cuda_here, repo_root,
                                                                                  monkeypatch):
    from cosmos_pl.config import round0_key
    from cosmos_pl.parsers import build_fit_parser

    parser = build_fit_parser()
    cfg = parser.parse_args(_fit_args(repo_root, "--trainer.accelerator", "gpu"))

    def key(gpu: str, torch_version: str = "2.14.1+cu130") -> str:
        cuda_here([f"0, GPU-a, {gpu}, 580.65.06, 8.9"])
        monkeypatch.setattr(torch, "__version__", torch_version)
        return round0_key(cfg, 1)

    base = key(RTX4090)
    assert json.loads(base)["resolved"] == {"device": "cuda", "threads": None, "gpus": [RTX4090],
                                            "torch": "2.14.1+cu130", "cudnn": cudnn_version()}
    assert key(RTX4090) == base  # the same GPU and torch: round 0 is reused
    assert key("NVIDIA GeForce RTX 3090") != base
    assert key(RTX4090, "2.11.0+cu128") != base
    # with the model and the versions put back as they were, nothing else differed
    other = json.loads(key("NVIDIA GeForce RTX 3090", "2.11.0+cu128"))
    other["resolved"].update(gpus=[RTX4090], torch="2.14.1+cu130")
    assert other == json.loads(base)


@pytest.mark.gpu_path
def test_a_flower_node_on_a_gpu_without_bf16_runs_the_fallback_or_refuses(monkeypatch):
    """run_precision (what a Flower node calls before it builds its client runtime) on a faked T4 (7.5): the
    fallback where set, the refusal where not; an A100 (8.0) and the CPU keep bf16-mixed."""
    from types import SimpleNamespace

    import cosmos_pl.config as config
    from cosmos_pl.errors import ConfigError
    from cosmos_pl.training import cuda_check

    capability = {"value": 7.5}
    monkeypatch.setattr(config, "gpus_in_use", lambda executor, accelerator: [] if accelerator == "cpu" else [0])
    monkeypatch.setattr(cuda_check, "gpu_facts",
                        lambda gpus, smi=None: ([cuda_check.GpuFacts(0, "GPU", capability["value"])], ["GPU"]))

    def init(fallback, accelerator="gpu"):
        return SimpleNamespace(executor=SimpleNamespace(devices="auto", kind="auto"),
                               trainer=SimpleNamespace(precision="bf16-mixed", precision_fallback=fallback,
                                                       accelerator=accelerator))

    node = init("16-mixed")
    assert config.run_precision(node).startswith("precision: 16-mixed instead of bf16-mixed")
    assert node.trainer.precision == "16-mixed"
    with pytest.raises(ConfigError, match="trainer.precision_fallback 16-mixed"):
        config.run_precision(init(None))
    capability["value"] = 8.0
    a100 = init(None)
    assert config.run_precision(a100) == "" and a100.trainer.precision == "bf16-mixed"
    cpu = init(None, accelerator="cpu")
    assert config.run_precision(cpu) == "" and cpu.trainer.precision == "bf16-mixed"

"""Why torch cannot use CUDA on this machine, and what a run uses: one line each.

:func:`cuda_unavailable_reason` says why ``torch.cuda.is_available()`` is False where it can tell (a CPU-only torch
build, no NVIDIA GPU or driver, an NVIDIA driver older than the torch wheel's CUDA needs) and how to fix it (a
torch build that matches the driver, or a newer driver); ``trainer.accelerator gpu`` without CUDA is refused with
it (:func:`cosmos_pl.config.validate_config`, :func:`~cosmos_pl.training.config.resolve_device`).
:func:`describe_device` is what a run trains on (the CPU, or the GPUs by name, with the driver, torch's CUDA and
the precision), printed as the first line of every ``fit`` (:func:`device_line`) and kept in summary.json.
:func:`gpu_facts` names the GPUs a run uses with their compute capability; :func:`check_kernels` refuses a GPU
the torch build has no kernels for, and :func:`choose_precision` bf16-mixed on a GPU without native bfloat16
(running ``trainer.precision_fallback`` instead where it is set); both before round 0
(:func:`cosmos_pl.config.validate_config`).

The GPUs are read with ``nvidia-smi`` (:func:`nvidia_smi_gpus`), so that this process opens no CUDA context on
them (parallel workers own the GPUs); torch is asked only where ``nvidia-smi`` is absent. Nothing here imports
Lightning.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import warnings
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import torch

from cosmos_pl.errors import ConfigError

__all__ = ["MIN_DRIVER", "CUDA12_BACKEND", "NATIVE_BF16_CAPABILITY", "NvidiaGpu", "NvidiaSmi", "GpuFacts",
           "nvidia_smi_gpus", "cuda_unavailable_reason", "install_hint", "gpu_facts", "check_kernels",
           "choose_precision", "cudnn_version", "describe_device", "device_line"]

# The oldest NVIDIA driver (major version, Linux) that runs a CUDA build of each major version, under CUDA's minor
# version compatibility: NVIDIA, "CUDA Compatibility", Minor Version Compatibility, Table 1 "CUDA Toolkit 11.x,
# 12.x, and 13.x Driver Version Ranges" (https://docs.nvidia.com/deploy/cuda-compatibility/
# minor-version-compatibility.html): CUDA 13.x >= 580, CUDA 12.x >= 525, CUDA 11.x >= 450. Newer drivers keep
# running older CUDA builds (backward compatibility).
MIN_DRIVER = {13: 580, 12: 525, 11: 450}

# The CUDA 12 build of torch to suggest where the driver is too old for CUDA 13. PyTorch's release matrix
# (RELEASE.md in pytorch/pytorch) ships CUDA 12.6 as the "legacy" CUDA for 2.11 through 2.14 (beside 12.8 and 13.0
# in 2.11; 13.0 and 13.2 from 2.12, which dropped 12.8), and 12.6 was a stable CUDA since 2.6: cu126 is the one CUDA
# 12 index every recent release is on (cu128 has no torch >= 2.12). Its kernels stop at Hopper (compute capability
# 9.0): a Blackwell GPU (10.0, 12.0) needs a newer driver instead.
CUDA12_BACKEND = "cu126"
CUDA12_LAST_CAPABILITY = 9.0
# The oldest compute capability that torch's CUDA 12.6 build has kernels for, where the CUDA 13 builds start at 7.5
# (PYTORCH_RELEASES_CODE_CC in torch/cuda/__init__.py: cu126 x86_64 50 60 70 75 80 86 90; cu130 75 80 86 90 100 120).
CUDA12_FIRST_CAPABILITY = 5.0
INDEX = "https://download.pytorch.org/whl"
# bfloat16 runs natively (tensor cores, cuDNN convolutions) from compute capability 8.0 (Ampere) on; below, torch
# emulates it (torch.cuda.is_bf16_supported(including_emulation=True) says yes on a T4) or has no kernels for it.
NATIVE_BF16_CAPABILITY = 8.0
DEVICE_NODE = "/dev/nvidia0"  # the first NVIDIA GPU's device file, where a driver is loaded


@dataclass
class NvidiaGpu:
    """One GPU as ``nvidia-smi`` lists it: its index (PCI bus order), UUID, name, driver version and compute
    capability (None where this driver's ``nvidia-smi`` does not report it)."""

    index: str
    uuid: str
    name: str
    driver: str
    capability: Optional[float] = None

    @property
    def driver_major(self) -> Optional[int]:
        match = re.match(r"(\d+)", self.driver)
        return int(match.group(1)) if match else None


@dataclass
class NvidiaSmi:
    """What ``nvidia-smi`` said: ``status`` "absent" (not on PATH), "failed" (``error``: its first line) or "ok"
    (``gpus``, possibly none)."""

    status: str
    gpus: list[NvidiaGpu] = field(default_factory=list)
    error: str = ""

    @property
    def driver(self) -> Optional[str]:
        return self.gpus[0].driver if self.gpus else None

    @property
    def driver_major(self) -> Optional[int]:
        return self.gpus[0].driver_major if self.gpus else None


def nvidia_smi_gpus(timeout: float = 20) -> NvidiaSmi:
    """Every GPU ``nvidia-smi`` lists (it opens no CUDA context); the compute capability where its driver
    reports it (``compute_cap``, drivers from about 510 on: the query is repeated without it otherwise)."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return NvidiaSmi("absent")
    error = ""
    for fields in ("index,uuid,name,driver_version,compute_cap", "index,uuid,name,driver_version"):
        try:
            done = subprocess.run([exe, f"--query-gpu={fields}", "--format=csv,noheader"], capture_output=True,
                                  text=True, timeout=timeout)
        except (OSError, subprocess.SubprocessError) as err:
            return NvidiaSmi("failed", error=_one_line(str(err)) or type(err).__name__)
        if done.returncode == 0:
            with_capability = fields.endswith("compute_cap")
            gpus = [_parse_row(line, with_capability=with_capability) for line in done.stdout.splitlines()
                    if line.strip()]
            return NvidiaSmi("ok", [gpu for gpu in gpus if gpu is not None])
        error = _one_line(done.stdout + "\n" + done.stderr) or f"exit status {done.returncode}"
    return NvidiaSmi("failed", error=error)


def _parse_row(line: str, *, with_capability: bool) -> Optional[NvidiaGpu]:
    parts = [p.strip() for p in line.split(",")]
    if len(parts) < (5 if with_capability else 4):
        return None
    capability = None
    if with_capability:
        try:
            capability = float(parts.pop())
        except ValueError:  # [N/A]
            pass
    return NvidiaGpu(parts[0], parts[1], ", ".join(parts[2:-1]), parts[-1], capability)


def _one_line(text: str, limit: int = 300) -> str:
    """The first non-empty line of ``text``, whitespace collapsed, at most ``limit`` characters."""
    for line in text.splitlines():
        line = " ".join(line.split())
        if line:
            return line if len(line) <= limit else line[:limit - 3] + "..."
    return ""


def _versions() -> tuple[str, str]:
    """The installed torch and torchvision versions without their local part (``2.14.1+cu130`` -> ``2.14.1``);
    torchvision "" where it is not installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        vision = version("torchvision").split("+")[0]
    except PackageNotFoundError:
        vision = ""
    return torch.__version__.split("+")[0], vision


def install_hint(backend: str) -> str:
    """How to install the installed torch release built for ``backend`` (``cu126``, ``cu130``, ``auto``): this
    repository's ``make demo TORCH_BACKEND=...`` (uv's ``--torch-backend``), or pip from PyTorch's index."""
    torch_version, vision = _versions()
    pins = f"torch=={torch_version}" + (f" torchvision=={vision}" if vision else "")
    if backend == "auto":
        return "`make demo TORCH_BACKEND=auto` (uv picks the build the driver runs)"
    return f"`make demo TORCH_BACKEND={backend}`, or `pip install {pins} --index-url {INDEX}/{backend}`"


def _backend_for(driver_major: Optional[int]) -> Optional[str]:
    """The torch CUDA build a driver runs: cu130 from 580 on, cu126 from 525 on; None for an older driver."""
    if driver_major is None:
        return None
    if driver_major >= MIN_DRIVER[13]:
        return "cu130"
    if driver_major >= MIN_DRIVER[12]:
        return CUDA12_BACKEND
    return None


def _gpus_text(smi: NvidiaSmi) -> str:
    names = sorted({gpu.name for gpu in smi.gpus})
    count = len(smi.gpus)
    return f"{count} GPU{'s' if count != 1 else ''}: {', '.join(names)}"


def _torch_warning() -> str:
    """The warning ``torch.cuda.is_available()`` gives for why CUDA did not initialise ("" for none). torch warns
    once per process, at the first call: caught here when this is the first, else from a fresh Python."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.is_available()
    for w in caught:
        return _trim_warning(str(w.message))
    try:
        done = subprocess.run([sys.executable, "-W", "always", "-c", "import torch; torch.cuda.is_available()"],
                              capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.SubprocessError):
        return ""
    for line in done.stderr.splitlines():
        if "Warning: " in line:
            return _trim_warning(line.split("Warning: ", 1)[1])
    return ""


def _trim_warning(text: str) -> str:
    text = " ".join(text.split()).split(" (Triggered internally at")[0]
    return _one_line(text.removeprefix("CUDA initialization: "))


def cuda_unavailable_reason(smi: Optional[NvidiaSmi] = None, otherwise: str = "or use trainer.accelerator cpu") -> str:
    """Why torch cannot use CUDA here, and the fix, as one line (no final period), for a machine where
    ``torch.cuda.is_available()`` is False: a CPU-only torch build, no NVIDIA GPU or driver, an NVIDIA driver older
    than the torch build's CUDA needs (:data:`MIN_DRIVER`), ``CUDA_VISIBLE_DEVICES`` hiding every GPU; otherwise
    what ``nvidia-smi`` lists and torch's own warning. ``smi``: ``nvidia-smi``'s answer when already asked;
    ``otherwise``: the way out without a GPU, said where the GPU cannot be fixed by a torch install alone."""
    smi = smi if smi is not None else nvidia_smi_gpus()
    version, wheel_cuda = torch.__version__, torch.version.cuda
    no_device = smi.status == "absent" and not os.path.exists(DEVICE_NODE)
    cpu_fallback = otherwise
    if wheel_cuda is None:
        if getattr(torch.version, "hip", None):
            return (f"torch {version} is a ROCm (AMD) build and sees no usable AMD GPU; for an NVIDIA GPU install "
                    f"a CUDA build of torch ({install_hint(_backend_for(smi.driver_major) or 'auto')}), "
                    f"{cpu_fallback}")
        if sys.platform == "darwin":
            return "torch on macOS has no CUDA; use trainer.accelerator cpu"
        if no_device or smi.status != "ok" or not smi.gpus:
            return (f"torch {version} is a CPU-only build, and no NVIDIA GPU or driver was found (nvidia-smi "
                    f"{'absent' if smi.status == 'absent' else smi.status}); on a machine with one, install a CUDA "
                    f"build of torch ({install_hint('auto')}), {cpu_fallback}")
        backend = _backend_for(smi.driver_major)
        fix = (f"install a CUDA build of torch ({install_hint(backend)})" if backend else
               f"update the NVIDIA driver to >= {MIN_DRIVER[13]} and install a CUDA build of torch "
               f"({install_hint('cu130')})")
        return (f"torch {version} is a CPU-only build (nvidia-smi lists {_gpus_text(smi)}; driver {smi.driver}); "
                f"{fix}, {cpu_fallback}")
    if smi.status == "absent":
        if no_device:
            return (f"no NVIDIA GPU or driver found (nvidia-smi absent, no {DEVICE_NODE}); run where there is one "
                    f"(in a container: docker run --gpus all), {cpu_fallback}")
        said = _torch_warning()
        return (f"{DEVICE_NODE} exists but nvidia-smi is absent, so the NVIDIA driver cannot be checked"
                f"{f'; torch says: {said}' if said else ''}; install the NVIDIA driver's utilities (in a container: "
                f"docker run --gpus all), {cpu_fallback}")
    if smi.status == "failed":
        return (f"nvidia-smi fails ({smi.error}): the NVIDIA driver is not working (after a driver update, "
                f"reboot); reinstall the driver, {cpu_fallback}")
    if not smi.gpus:
        return f"nvidia-smi lists no GPU; check that the NVIDIA driver sees one, {cpu_fallback}"
    major = int(wheel_cuda.split(".")[0])
    need, driver = MIN_DRIVER.get(major), smi.driver_major
    gpus = f"nvidia-smi lists {_gpus_text(smi)}"
    if need is not None and driver is not None and driver < need:
        blackwell = any(g.capability is not None and g.capability > CUDA12_LAST_CAPABILITY for g in smi.gpus)
        if major >= 13 and driver >= MIN_DRIVER[12] and not blackwell:
            fix = (f"install a torch built for CUDA 12 ({install_hint(CUDA12_BACKEND)}) or update the NVIDIA "
                   f"driver to >= {need}")
        elif major >= 13 and driver >= MIN_DRIVER[12]:  # the CUDA 12.6 build has no kernels for Blackwell
            fix = (f"update the NVIDIA driver to >= {need} (torch's CUDA 12.6 build has no kernels for compute "
                   f"capability {max(g.capability or 0 for g in smi.gpus):.1f})")
        else:
            fix = f"update the NVIDIA driver to >= {need}" + (
                f" (or >= {MIN_DRIVER[12]} with a torch built for CUDA 12: {install_hint(CUDA12_BACKEND)})"
                if major >= 13 else "")
        return (f"the NVIDIA driver {smi.driver} is too old for torch {version}, a CUDA {wheel_cuda} build that "
                f"needs driver >= {need} ({gpus}); {fix}")
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1", "none", "void", "NoDevFiles"):
        return (f"CUDA_VISIBLE_DEVICES={visible!r} hides every GPU ({gpus}); unset it or name the GPUs to use, "
                f"{cpu_fallback}")
    said = _torch_warning()
    enough = f"driver {smi.driver}" + (f", new enough for torch {version}'s CUDA {wheel_cuda}" if need else "")
    where = f" (CUDA_VISIBLE_DEVICES={visible!r})" if visible is not None else ""
    return (f"{gpus} ({enough}) but torch could not initialise CUDA{where}"
            f"{f': {said}' if said else ''}; see `python -c 'import torch; torch.cuda.init()'`, {cpu_fallback}")


@dataclass(frozen=True)
class GpuFacts:
    """One GPU a run uses: its visible id, its name and its compute capability (e.g. 8.9), None where unknown."""

    id: int
    name: Optional[str]
    capability: Optional[float]


def gpu_facts(gpus: Sequence[tuple[int, str]], smi: Optional[NvidiaSmi] = None) -> tuple[list[GpuFacts], list[str]]:
    """The GPUs ``gpus`` (each visible id with its ``CUDA_VISIBLE_DEVICES`` entry) by name and compute capability,
    and the GPU models they are (sorted, each once).

    Read from ``nvidia-smi`` (``smi``: its answer when already asked), which opens no CUDA context; torch is asked
    only where it is absent. Where ``nvidia-smi``'s rows cannot be matched to the ids (a MIG slice; GPUs of
    different models without ``CUDA_DEVICE_ORDER=PCI_BUS_ID``, where CUDA numbers them fastest first), the names
    are None, the models are every model ``nvidia-smi`` lists, and the capability is theirs where they all share
    one (else None).
    """
    smi = smi if smi is not None else nvidia_smi_gpus()
    listed = smi.gpus if smi.status == "ok" else []
    # CUDA numbers GPUs fastest first unless CUDA_DEVICE_ORDER=PCI_BUS_ID, nvidia-smi by PCI bus: an index names
    # the same GPU in both where every GPU is the same model, or in that order (as devices.gpu_free_bytes)
    same_order = len({g.name for g in listed}) <= 1 or os.environ.get("CUDA_DEVICE_ORDER") == "PCI_BUS_ID"
    rows: list[Optional[NvidiaGpu]] = []
    for _, entry in gpus:
        match = [g for g in listed if (same_order and g.index == entry) or (entry.startswith("GPU-")
                                                                         and g.uuid.startswith(entry))]
        rows.append(match[0] if match else None)
    if listed and None in rows:  # a MIG slice, or an order that may differ: what nvidia-smi lists
        capabilities = {g.capability for g in listed}
        shared = capabilities.pop() if len(capabilities) == 1 else None
        return [GpuFacts(i, None, shared) for i, _ in gpus], sorted({g.name for g in listed})
    if listed:
        facts = [GpuFacts(i, row.name, row.capability) for (i, _), row in zip(gpus, rows) if row is not None]
    else:
        facts = []
        for i, _ in gpus:  # no nvidia-smi: torch names them (this initialises CUDA in this process)
            try:
                major, minor = torch.cuda.get_device_capability(i)
                facts.append(GpuFacts(i, torch.cuda.get_device_name(i), major + minor / 10))
            except (RuntimeError, AssertionError):
                facts.append(GpuFacts(i, None, None))
    return facts, sorted({f.name for f in facts if f.name is not None})


def _which(gpus: Sequence[GpuFacts]) -> str:
    """``GPU 0 (Tesla T4, compute capability 7.5)``; GPUs of one model and capability together (``GPUs 0, 1
    (...)``), groups joined by "and"."""
    groups: dict[tuple[Optional[str], Optional[float]], list[int]] = {}
    for g in gpus:
        groups.setdefault((g.name, g.capability), []).append(g.id)
    parts = []
    for (name, capability), ids in groups.items():
        what = ", ".join(p for p in (name, f"compute capability {capability:.1f}" if capability else None) if p)
        parts.append(f"GPU{'s' if len(ids) > 1 else ''} {', '.join(map(str, ids))}" + (f" ({what})" if what else ""))
    return " and ".join(parts)


def _capability_code(capability: float) -> int:
    """Compute capability 8.9 as 89, 12.0 as 120: the number in an arch name such as ``sm_89``."""
    return int(round(capability * 10))


def _runs_on(device_code: int, arch: str) -> bool:
    """Whether code built for ``arch`` (``sm_86``, ``sm_90a``, ``compute_120``: an entry of
    ``torch.cuda.get_arch_list()``) runs on a GPU of compute capability ``device_code`` (89 for 8.9): torch's own
    rule (``torch.cuda._code_compatible_with_device``, which knows the exceptions such as Jetson's 8.7) where this
    torch has it, else the general one: the same major version, a minor version at most the GPU's."""
    match = re.match(r"(?:sm|compute)_(\d+)", arch)
    if match is None:
        return False
    code = int(match.group(1))
    rule = getattr(torch.cuda, "_code_compatible_with_device", None)
    if rule is not None:
        with warnings.catch_warnings():  # an arch newer than this torch's table: the general rule, without a word
            warnings.simplefilter("ignore")
            try:
                return bool(rule(device_code, code))
            except Exception:  # a torch whose private helper changed: the general rule below
                pass
    return code // 10 == device_code // 10 and code % 10 <= device_code % 10


def check_kernels(gpus: Sequence[GpuFacts], arch_list: Sequence[str], accelerator: str) -> None:
    """Refuse GPUs the installed torch has no kernels for (a V100, compute capability 7.0, with a CUDA 13 build,
    which is built for 7.5 and newer: its first kernel would fail with "no kernel image"). ``arch_list``:
    ``torch.cuda.get_arch_list()`` (empty: not known, nothing refused); a GPU of unknown capability passes.

    Raises:
        ConfigError: naming ``trainer.accelerator``, the GPUs, the architectures torch is built for and the fix.
    """
    if not arch_list:
        return
    missing = [g for g in gpus if g.capability is not None
               and not any(_runs_on(_capability_code(g.capability), arch) for arch in arch_list)]
    if not missing:
        return
    lowest = min(g.capability for g in missing if g.capability is not None)
    cuda_major = int(torch.version.cuda.split(".")[0]) if torch.version.cuda else None
    if cuda_major is not None and cuda_major >= 13 and CUDA12_FIRST_CAPABILITY <= lowest < 7.5:
        fix = f"install torch's CUDA 12.6 build, which has kernels for it ({install_hint(CUDA12_BACKEND)})"
    else:
        fix = (f"install a torch build with kernels for compute capability {lowest:.1f} "
               "(https://pytorch.org/get-started/locally/)")
    raise ConfigError(f"trainer.accelerator={accelerator!r}: torch {torch.__version__} has no kernels for "
                      f"{_which(missing)} (it is built for {' '.join(arch_list)}); {fix}, or use trainer.accelerator "
                      "cpu")


def choose_precision(precision: str, fallback: Optional[str], gpus: Sequence[GpuFacts]) -> tuple[str, str]:
    """The precision the stages run in on ``gpus`` (the GPUs in use), and the line that says why it is not
    ``precision`` ("" where it is).

    bf16-mixed runs as asked where every GPU in use has native bfloat16 (compute capability >= 8.0:
    :data:`NATIVE_BF16_CAPABILITY`; a GPU of unknown capability counts as having it). Where one has not, the whole
    run takes ``fallback`` (``trainer.precision_fallback``: "16-mixed", which Lightning trains with a gradient
    scaler, or "32-true"), so that every client trains in one precision. Any other precision runs as asked.

    Raises:
        ConfigError: bf16-mixed on a GPU below 8.0 and no ``fallback``, naming the GPUs, their capability and
            the fix.
    """
    if precision != "bf16-mixed":
        return precision, ""
    old = [g for g in gpus if g.capability is not None and g.capability < NATIVE_BF16_CAPABILITY]
    if not old:
        return precision, ""
    why = (f"{_which(old)} has no native bfloat16 (compute capability {NATIVE_BF16_CAPABILITY:.1f} or newer: A100, "
           "RTX 30xx, L4, H100 and later)")
    if fallback is None:
        raise ConfigError(f"trainer.precision='bf16-mixed': {why}, so torch would emulate it, slowly, or find no "
                          "kernel; use trainer.precision 16-mixed (or 32-true), or let such a GPU run another with "
                          "trainer.precision_fallback 16-mixed")
    return fallback, f"precision: {fallback} instead of bf16-mixed (trainer.precision_fallback): {why}"


def cudnn_version() -> Optional[int]:
    """The version of the cuDNN torch loads (91002 for 9.10.2); None for a torch without cuDNN.

    Read from torch's cuDNN binding, as ``torch.backends.cudnn.version()`` reads it, but without the check that
    function makes on its first call where CUDA is available: it asks every GPU's capability, which initialises
    CUDA in this process (the workers own the GPUs)."""
    binding = getattr(torch._C, "_cudnn", None)
    try:
        return int(binding.getVersionInt()) if binding is not None else None
    except (AttributeError, RuntimeError):
        return None


def _precision(precision: str, device_type: str) -> str:
    """``trainer.precision`` as the stages run it on ``device_type``: "32" is "32-true"; Lightning trains
    16-mixed as bf16-mixed on the CPU (it has no float16 autocast there), and inference runs in float32."""
    if precision == "32":
        return "32-true"
    if precision == "16-mixed" and device_type == "cpu":
        return "16-mixed (on the CPU: training in bf16-mixed, inference in 32-true)"
    return precision


def describe_device(accelerator: str, precision: str, gpus: Sequence[tuple[int, str]] = (),
                    cpu_cores: Optional[int] = None, *, precision_fallback: Optional[str] = None,
                    deterministic: Any = False, benchmark: bool = False) -> dict[str, Any]:
    """What a run's stages train on, for its first line (:func:`device_line`) and summary.json.

    Always: ``accelerator``, ``type`` ("cuda" or "cpu": what it resolves to on this machine), ``torch``, ``cuda``
    (the torch build's CUDA, None for a CPU-only build), ``precision`` as the stages run it (on a GPU without
    native bfloat16, ``precision_fallback`` instead of bf16-mixed, with ``precision_note`` the line saying so:
    :func:`choose_precision`), ``deterministic`` (``trainer.deterministic``) and ``benchmark`` (whether cuDNN
    autotuning runs, as given: :func:`cosmos_pl.training.config.autotuning`).
    On a GPU: ``gpu_ids`` (``gpus``: each visible id with its ``CUDA_VISIBLE_DEVICES`` entry), ``gpus`` (their
    names) and ``capabilities`` (their compute capabilities) by ``nvidia-smi``, else by torch (None where unknown;
    with ``gpu_models`` where the names are: :func:`gpu_facts`), ``driver`` (the NVIDIA driver, None without
    ``nvidia-smi``) and ``cudnn`` (cuDNN's version as torch reports it, e.g. 91002 for 9.10.2).
    On the CPU: ``cpu_cores``, and those GPU entries null; ``"auto"`` on a machine whose GPUs torch cannot use
    says why (``cpu_reason``).

    Raises:
        ConfigError: bf16-mixed on a GPU without native bfloat16 and no ``precision_fallback``.
    """
    cuda = accelerator in ("gpu", "cuda") or (accelerator == "auto" and torch.cuda.is_available())
    device_type = "cuda" if cuda else "cpu"
    info: dict[str, Any] = {"accelerator": accelerator, "type": device_type, "torch": torch.__version__,
                            "cuda": torch.version.cuda, "precision": _precision(precision, device_type),
                            "deterministic": deterministic, "benchmark": benchmark}
    if not cuda:
        info.update(cpu_cores=cpu_cores if cpu_cores is not None else (os.cpu_count() or 1), gpu_ids=None, gpus=None,
                    capabilities=None, driver=None, cudnn=None)
        if accelerator == "auto" and shutil.which("nvidia-smi") is not None:
            smi = nvidia_smi_gpus()
            if smi.status == "ok" and smi.gpus:  # GPUs torch cannot use: the run would otherwise fall back silently
                info["cpu_reason"] = cuda_unavailable_reason(smi)
        return info
    smi = nvidia_smi_gpus()
    facts, models = gpu_facts(gpus, smi)
    names = [f.name for f in facts]
    if None in names and models:
        info["gpu_models"] = models
    runs, note = choose_precision(precision, precision_fallback, facts)
    if note:
        info.update(precision=runs, precision_note=note)
    info.update(gpu_ids=[i for i, _ in gpus], gpus=names, capabilities=[f.capability for f in facts],
                driver=smi.driver, cudnn=cudnn_version())
    return info


def device_line(info: dict[str, Any]) -> str:
    """The run's first line from :func:`describe_device`, e.g. ``device: CPU (2 cores; torch 2.14.1+cu130),
    precision 32-true`` or ``device: 2 x NVIDIA GeForce RTX 4090 (GPUs 0, 1; driver 575.57.08; torch
    2.14.1+cu126, CUDA 12.6), precision bf16-mixed``."""
    torch_text = f"torch {info['torch']}"
    if info["type"] == "cpu":
        why = f"; trainer.accelerator auto: {info['cpu_reason']}" if info.get("cpu_reason") else ""
        cores = info["cpu_cores"]
        return (f"device: CPU ({cores} core{'s' if cores != 1 else ''}; {torch_text}{why}), "
                f"precision {info['precision']}")
    ids, names = info["gpu_ids"], info["gpus"]
    if names and all(n is not None for n in names) and len(set(names)) == 1:
        what = f"{len(ids)} x {names[0]}" if len(ids) > 1 else names[0]
    elif names and all(n is not None for n in names):
        what = ", ".join(names)
    elif info.get("gpu_models"):
        what = f"{len(ids)} GPU{'s' if len(ids) != 1 else ''} of {' / '.join(info['gpu_models'])}"
    else:
        what = f"{len(ids)} GPU{'s' if len(ids) != 1 else ''}"
    label = "GPU" if len(ids) == 1 else "GPUs"
    driver = f"driver {info['driver']}" if info.get("driver") else "driver unknown (no nvidia-smi)"
    return (f"device: {what} ({label} {', '.join(map(str, ids))}; {driver}; {torch_text}, CUDA {info['cuda']}), "
            f"precision {info['precision']}")

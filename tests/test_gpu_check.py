"""benchmarks/gpu_check.sh: its dry run finishes on this CPU with the figures its header promises, also as on a GPU
machine without network (``--offline``: the carried wheels, every other package it lacks hidden); its GPU monitor
turns ``nvidia-smi`` samples into per-GPU peaks and means; its equality check names the first difference."""

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

from conftest import PROCESS_TIMEOUT_S  # noqa: E402
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
def test_offline_dry_run_finishes_on_a_cpu_with_every_figure(repo_root, tmp_path):
    # as on a GPU machine without network: the carried wheels where `make gpu-wheels` brought them (else this
    # Python's copies of the same packages), and every package outside gpu_offline.MACHINE, CARRIED and what they
    # require hidden from every import, in this process and in the spawned workers
    env = {**os.environ, "PY": sys.executable, "CUDA_VISIBLE_DEVICES": ""}
    env.pop("OUT", None)
    done = subprocess.run(["bash", str(BENCH / "gpu_check.sh"), "--dry-run", "--offline", "--data-dir",
                           str(tmp_path / "data"), "--run-dir", str(tmp_path / "run")], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=PROCESS_TIMEOUT_S)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout.splitlines()
    assert out[0].startswith(("carried wheels installed into ", "no benchmarks/wheels: "))
    assert out[1].startswith("dry run as an offline machine: ")
    assert any(line.startswith("ulimit -n: ") for line in out) and "nvidia-smi: absent" in out
    assert any(line.startswith("GPUs: 0: the two-GPU paths") and "NOT tested" in line for line in out)
    assert "cosmos-pl fit --help: parsed" in out
    steps = [line for line in done.stderr.splitlines() if line.startswith("== ") and ": " in line]
    assert [line.split(": passed, ")[0] for line in steps] == [
        "== cuda tests", "== sequential against parallel (ulimit -n 1024)", "== paper round"], steps
    assert done.stderr.splitlines()[-1].startswith("gpu_check: every step passed (")
    # on a CPU with one torch thread per task, sequential and parallel runs are equal under either setting
    [equality] = [json.loads(line) for line in out if line.startswith('{"equality"')]
    assert equality["equality"] == {"default flags": "equal", "trainer.deterministic true": "equal"}
    assert equality["passed"] is True and {r["exit"] for r in equality["runs"].values()} == {0}
    assert sorted(equality["runs"]) == ["default flags, parallel", "default flags, sequential",
                                        "trainer.deterministic true, parallel",
                                        "trainer.deterministic true, sequential"]
    # the parallel runs ran under the low open-file limit (soft and hard), the sequential ones under this machine's
    runs = {line.split(": ")[0].strip(): line for line in out if line.startswith("  ") and ", exit " in line}
    for setting in ("default flags", "trainer.deterministic true"):
        assert runs[f"{setting}, parallel"].endswith(", exit 0, open-file limit (1024, 1024)")
        assert runs[f"{setting}, sequential"].endswith(" s, exit 0")
    figures = json.loads(out[-1])
    assert figures["dry_run"] is True and figures["data"] == "stand-in: 250 + 100 16x16x3 images of 20 class patterns"
    assert figures["gpus"] == []
    assert figures["seconds_per_round"] > 0
    # 250 training images, U = 20% of them (50); 5 clients with the rest; one view besides the image (Eq. 1);
    # one epoch per stage (teacher_epochs 1 in the dry run)
    k = figures["clusters"]["K"]
    assert figures["images_per_round_by_stage"] == {"local training": 200, "pseudo-labels": 5 * 50,
                                                    "teacher distillation": k * 50 * 2,
                                                    "client distillation": 5 * 50 * 2}
    assert set(figures["images_per_second_by_stage"]) == set(figures["images_per_round_by_stage"])
    assert 1 <= k <= 5 and set(figures["final"]) == {"teacher_acc", "client_acc"}


def _guarded_python(tmp_path, site):
    from gpu_offline import guard

    guard(tmp_path / "guard", site)
    path = [str(tmp_path / "guard"), *([str(site)] if site else []), str(BENCH.parent)]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(path)}


PROBE = """
import importlib.metadata as md, importlib.util, json, sys
out = {"wandb": importlib.util.find_spec("wandb") is None}
try:
    md.version("submitit")
except md.PackageNotFoundError:
    out["submitit metadata"] = "hidden"
try:
    import flwr
except ModuleNotFoundError as err:
    out["flwr"] = str(err)
import jsonargparse, torch, cosmos_pl
out["jsonargparse"] = jsonargparse.__file__
out["torch"] = torch.__file__ == sys.argv[1]
print(json.dumps(out))
"""


def test_the_guard_hides_what_an_offline_gpu_machine_lacks(tmp_path):
    import torch

    # a carried package: found in the site folder only (here a stand-in jsonargparse with its metadata)
    site = tmp_path / "site"
    (site / "jsonargparse").mkdir(parents=True)
    (site / "jsonargparse" / "__init__.py").write_text("")
    (site / "jsonargparse-9.9.dist-info").mkdir()
    (site / "jsonargparse-9.9.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: jsonargparse\n"
                                                                  "Version: 9.9\n")
    done = subprocess.run([sys.executable, "-c", PROBE, torch.__file__], env=_guarded_python(tmp_path, site),
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout) == {"wandb": True, "submitit metadata": "hidden", "flwr": "No module named 'flwr'",
                                       "jsonargparse": str(site / "jsonargparse" / "__init__.py"), "torch": True}


def test_the_guard_hides_the_carried_packages_outside_their_site(tmp_path):
    site = tmp_path / "empty-site"  # the wheels not installed: this Python's own jsonargparse must not serve
    site.mkdir()
    done = subprocess.run([sys.executable, "-c", "import jsonargparse"], env=_guarded_python(tmp_path, site),
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and done.stderr.splitlines()[-1] == (
        "ModuleNotFoundError: No module named 'jsonargparse'")


def test_the_carried_packages_are_what_jsonargparse_signatures_needs_beyond_the_machine():
    from importlib.metadata import requires

    from gpu_offline import CARRIED, MACHINE, canonical
    from packaging.requirements import Requirement

    # jsonargparse[signatures] as pyproject.toml asks for it: itself, its own requirements and the extra's
    needed = {"jsonargparse"} | {canonical(Requirement(line).name) for line in requires("jsonargparse")
                                 if Requirement(line).marker is None
                                 or Requirement(line).marker.evaluate({"extra": "signatures"})}
    # PyYAML is the machine's (Lightning needs it too); typing-extensions, required by typeshed-client, too
    assert needed - set(MACHINE) == set(CARRIED) and "typing-extensions" not in CARRIED


def test_prune_keeps_the_pinned_wheel_of_each_package(tmp_path):
    from gpu_offline import prune

    for name in ("jsonargparse-4.52.0-py3-none-any.whl", "jsonargparse-4.53.0-py3-none-any.whl",
                 "docstring_parser-0.18.0-py3-none-any.whl", "other-1.0-py3-none-any.whl", "notes.txt"):
        (tmp_path / name).write_text("")
    kept = prune(tmp_path, ["jsonargparse==4.53.0", "docstring-parser==0.18.0"])
    assert [p.name for p in kept] == ["docstring_parser-0.18.0-py3-none-any.whl",
                                      "jsonargparse-4.53.0-py3-none-any.whl"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [  # the older jsonargparse gone (two stop pip), others kept
        "docstring_parser-0.18.0-py3-none-any.whl", "jsonargparse-4.53.0-py3-none-any.whl", "notes.txt",
        "other-1.0-py3-none-any.whl"]
    binary = "docstring_parser-0.18.0-cp312-cp312-linux_x86_64.whl"
    (tmp_path / "docstring_parser-0.18.0-py3-none-any.whl").rename(tmp_path / binary)
    with pytest.raises(SystemExit, match=f"{binary} is not a pure-Python wheel"):
        prune(tmp_path, ["jsonargparse==4.53.0", "docstring-parser==0.18.0"])


def test_first_difference_names_the_line_field_and_both_values(tmp_path):
    from gpu_check import first_difference

    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    (a / "metrics.csv").write_text("round,teacher_acc,client_acc\n0,,0.5\n1,0.8123,0.6\n")
    (a / "clients.csv").write_text("round,client,acc\n0,0,0.5\n")
    (b / "clients.csv").write_text("round,client,acc\n0,0,0.5\n")
    (b / "metrics.csv").write_text("round,teacher_acc,client_acc\n0,,0.5\n1,0.8125,0.6\n")
    assert first_difference(a, b) == "metrics.csv line 3 (round=1), teacher_acc: 0.8123 against 0.8125"
    (b / "metrics.csv").write_text((a / "metrics.csv").read_text())
    assert first_difference(a, b) is None
    (b / "clients.csv").write_text("round,client,acc\n0,0,0.5\n1,0,0.7\n")
    assert first_difference(a, b) == "clients.csv: 2 lines against 3"


def test_the_equality_run_is_the_tests_small_digits_run():
    from conftest import SMALL_DIGITS
    from gpu_check import SMALL_DIGITS as used

    assert used == SMALL_DIGITS


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
    # the cuda tests would all be skipped here, and pytest would exit 0 as if they had passed; with OUT set, all it
    # prints goes to $OUT/gpu_check.log too
    env = {**os.environ, "PY": sys.executable, "OUT": str(tmp_path / "out")}
    done = subprocess.run(["bash", str(BENCH / "gpu_check.sh"), "--data-dir", str(tmp_path / "data")], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stdout[-2000:]
    lines = done.stdout.splitlines()  # stdout and stderr together, as in the log
    assert lines[0].startswith("ulimit -n: ") and lines[1:3] == [
        "nvidia-smi: absent", "GPUs: 0: the two-GPU paths (a pinned worker per GPU, slots alternating GPUs) are NOT "
        "tested: need two"]
    assert len(lines) == 4 and lines[3].startswith("gpu_check: error: CUDA is not available: ")
    assert not any(line.startswith("==") for line in lines) and not (tmp_path / "data").exists()
    assert (tmp_path / "out" / "gpu_check.log").read_text() == done.stdout


def test_a_budget_that_is_not_whole_seconds_stops_it_at_once(tmp_path):
    done = subprocess.run(["bash", str(BENCH / "gpu_check.sh"), "--budget", "8m"], cwd=tmp_path,
                          env={**os.environ, "PY": "/nonexistent/python"}, capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout, done.stderr) == (
        2, "", "gpu_check: error: --budget '8m': give whole seconds, e.g. --budget 450\n")


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_prints_the_steps_and_runs_nothing(tmp_path, flag):
    """--help is the script's own: it never reaches gpu_check.py, whose help exits 0 and would count as step 2
    passed on a machine without a GPU."""
    done = subprocess.run(["bash", str(BENCH / "gpu_check.sh"), "--dry-run", flag], cwd=tmp_path,
                          env={**os.environ, "PY": "/nonexistent/python"}, capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.startswith("For a person with NVIDIA GPUs")
    assert "--budget S: the whole script in S seconds" in done.stdout
    assert "gpu_check: every step passed" not in done.stdout and "== cuda tests" not in done.stdout


def test_a_budget_without_seconds_stops_it_at_once(tmp_path):
    done = subprocess.run(["bash", str(BENCH / "gpu_check.sh"), "--budget"], cwd=tmp_path,
                          env={**os.environ, "PY": "/nonexistent/python"}, capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stderr) == (2, "gpu_check: error: --budget '(no value)': give whole seconds, e.g. "
                                                 "--budget 450\n")

"""What crossing processes costs: a model's round trip over the executor, and the open file descriptors of a fit.

Two measurements, each through public interfaces only, so that the same script measures an older checkout, run
from that checkout (``cd OLD_CHECKOUT && PYTHONPATH=$PWD python NEW_CHECKOUT/benchmarks/transfer.py``: the fit's
``python -m`` puts the working directory first on its path, and an editable install's finder comes before
``PYTHONPATH`` otherwise):

- ``--models``: the round trip of one model over a parallel executor of one worker: a training task whose work is
  nothing (the worker returns the model it was sent), timed from ``Executor.map`` to the model back in this process,
  the median of ``--repeat`` after a first send (the worker then holds the architecture). Models: the cifar100
  config's client (``mobilenetv2_100``) and teacher (``vgg16``), 100 classes, 32x32 inputs.
- ``--fit CONFIG``: a ``cosmos-pl fit`` in a child process, its open descriptors (``/proc/PID/fd``) and those of its
  worker processes read every 20 ms: the peaks during round 0 (until the line ``round 0 (local-only)``) and over
  the whole run; the peak use of ``/dev/shm`` above what it held at the start (meaningful where nothing else uses
  it meanwhile); the exit status and the final line.

The last line is JSON. Run it alone on the machine: two trainings at once slow each other down.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path


def _returned(model):
    """The task: no work; the executor sends the model back."""
    return None


def model_round_trip(name: str, repeat: int) -> dict:
    import torch

    from cosmos_pl.execution.executor import Executor, ExecutorConfig
    from cosmos_pl.models import create_backbone

    model = create_backbone(name, 100, 3, 32)
    tensors = len(list(model.state_dict().values()))
    size = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    executor = Executor(ExecutorConfig(kind="parallel", devices=2, threads_per_worker=1), "cpu")
    executor._set_workers_per_device(1)
    times = []
    try:
        for i in range(repeat + 1):
            start = time.perf_counter()
            [(_, back, _)] = list(executor.map([(_returned, {"model": model})], returns_model=True))
            times.append(time.perf_counter() - start)
            assert torch.equal(next(iter(back.state_dict().values())), next(iter(model.state_dict().values())))
            model = back  # the next round trip sends the returned model, as a round does
    finally:
        executor.close()
    return {"model": name, "tensors": tensors, "MiB": round(size / 2 ** 20, 1),
            "first_ms": round(1e3 * times[0], 1), "median_ms": round(1e3 * statistics.median(times[1:]), 1),
            "min_ms": round(1e3 * min(times[1:]), 1)}


def _fds(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except OSError:
        return []


def fit_descriptors(config: str, extra: list[str]) -> dict:
    cmd = [sys.executable, "-m", "cosmos_pl.cli", "fit", "--config", config, "--run_dir",
           f"/tmp/transfer-bench-{os.getpid()}", "--overwrite", "true", *extra]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    peaks = {"main_round0": 0, "workers_round0": 0, "main": 0, "workers": 0}
    in_round0 = [True]
    lines: list[str] = []

    def read() -> None:
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("round 0 (local-only)"):
                in_round0[0] = False

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    start = time.monotonic()
    shm_start = shutil.disk_usage("/dev/shm").used
    shm_peak = 0
    while proc.poll() is None:
        shm_peak = max(shm_peak, shutil.disk_usage("/dev/shm").used - shm_start)
        main = _fds(proc.pid)
        workers = max([_fds(c) for c in _children(proc.pid)] or [0])
        peaks["main"], peaks["workers"] = max(peaks["main"], main), max(peaks["workers"], workers)
        if in_round0[0]:
            peaks["main_round0"] = max(peaks["main_round0"], main)
            peaks["workers_round0"] = max(peaks["workers_round0"], workers)
        time.sleep(0.02)
    reader.join(timeout=5)
    final = [ln.strip() for ln in lines if ln.startswith("final round")]
    return {"config": config, "extra": extra, "rc": proc.returncode, "seconds": round(time.monotonic() - start, 1),
            "peak_fds": peaks, "peak_shm_MiB": round(shm_peak / 2 ** 20, 2), "final": final[0] if final else "".join(lines[-5:])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="*", default=None, help="backbones to time (default: mobilenetv2_100 vgg16)")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--fit", default=None, help="a config to run as `cosmos-pl fit`, counting descriptors")
    parser.add_argument("fit_args", nargs="*", help="more fit flags, after --")
    args = parser.parse_args()
    out: dict = {}
    if args.models is not None or args.fit is None:
        out["models"] = []
        for name in args.models or ["mobilenetv2_100", "vgg16"]:
            row = model_round_trip(name, args.repeat)
            print(row, flush=True)
            out["models"].append(row)
    if args.fit:
        row = fit_descriptors(args.fit, args.fit_args)
        print(row, flush=True)
        out["fit"] = row
    print(json.dumps(out))


if __name__ == "__main__":
    main()

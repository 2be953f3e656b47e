"""One round of the paper's setup on the GPUs present, the body of ``benchmarks/gpu_check.sh`` (which runs the
``cuda`` tests first).

``python benchmarks/gpu_check.py [--dry-run] [--offline] [--check | --equality] [--data-dir DIR] [--run-dir DIR]
[cosmos-pl overrides ...]``

The setup is configs/cifar100.yaml as it is (COSMOS, Section 6 and Appendix C: 25 clients in 5 class groups,
MobileNetV2 and SqueezeNet clients, VGG16 cluster teachers, bf16-mixed), on CIFAR-100 where torchvision can load or
download it into the data folder. Otherwise on a same-shape stand-in (:func:`write_standin`): 50,000 + 10,000
32x32x3 uint8 images of 100 classes, each class a fixed smooth random pattern under pixel noise, which the
partitioner splits into the same 5 class groups. It is meant to be learnt quickly, so that the clustering finds
the groups as on CIFAR-100; that has not been checked at full size (no GPU here), and K and the adjusted Rand index
in the output say whether it did. ``--dry-run`` shrinks everything (250 + 100 stand-in images of 20 classes at
16x16, 5 clients, one epoch in round 0, timm's test backbones, float32, no download, ``trainer.accelerator auto``)
so that the script's logic finishes in seconds on a CPU; its timings and clusters mean nothing (its tiny models do
not find the groups). Without ``--dry-run`` it needs CUDA: where torch cannot use it, it exits with status 2 before
anything runs, saying why (the NVIDIA driver against the torch wheel's CUDA, no NVIDIA GPU) and how to fix it.

Round 0 trains with the config's epochs (10: clients must have learned their classes for the clustering to find
the groups), the PTC round with one (warm-up); round 2, an IFFT round with the config's epochs, is timed. The last
line printed is JSON: seconds per round and per stage, images per second per stage, per GPU the peak memory and
mean utilisation of every process on it, K and the adjusted Rand index, the data used. ``--offline``: CIFAR-100 only
where it is already in the data folder (no download tried), else the stand-in.

``--equality`` (:func:`equality`) runs instead the small digits run of ``tests/conftest.py`` four times at once: in
one process (``executor.kind sequential``) and in two workers per GPU (``parallel``; over every GPU there is), each
under the default flags and under ``trainer.deterministic true``, and says per setting whether ``metrics.csv`` and
``clients.csv`` are equal or where they first differ. The parallel runs go under an open-file limit of 1,024, soft
and hard (as ``ulimit -n 1024`` in a shell; cosmos-pl raises only its soft limit, up to the hard one), as on a
desktop or in a container that keeps it low; the sequential ones under the machine's. A dry run: round 0 and one
round, 2 clients, one worker. Its runs go to a new temporary folder, or beside ``--run-dir`` (``RUN_DIR-equality``);
cosmos-pl overrides are for the paper round and ignored here. Exit status 1 where a run fails or the deterministic
runs differ (under the default flags a difference is reported, not failed: it is not promised); a JSON line with each
result. ``--deadline S`` stops the runs still going S seconds after the start (they count as failed).
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _common, paper_round, gpu_offline: imported where used

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "configs/cifar100.yaml"
FULL = {"train": 50_000, "test": 10_000, "classes": 100, "size": 32}
DRY = {"train": 250, "test": 100, "classes": 20, "size": 16}
# tiny, offline and fast on one CPU core: the script's path, not the paper's numbers
DRY_RUN_SETTINGS = ["--data.num_clients", "5", "--clients.pretrain_epochs", "1",
                    "--data.test_samples_per_client", "10",
                    "--clients.backbones", "[test_efficientnet, lcnet_035]", "--clients.batch_size", "32",
                    "--algorithm.init_args.teacher_backbone", "test_efficientnet",
                    "--algorithm.init_args.teacher_batch_size", "32", "--algorithm.init_args.teacher_epochs", "1",
                    "--trainer.accelerator", "auto", "--trainer.precision", "32-true",
                    "--trainer.inference_batch_size", "256",
                    "--executor.threads_per_worker", "1"]
#: tests/conftest.py's small digits run (COSMOS on scikit-learn's digits, 5 clients, rounds 0..2, one epoch per
#: stage, one torch CPU thread per task); tests/test_gpu_check.py checks the two lists are the same
SMALL_DIGITS = ["--rounds", "2", "--data.num_clients", "5", "--clients.pretrain_epochs", "1",
                "--algorithm.init_args.ptc_epochs", "1", "--algorithm.init_args.teacher_epochs", "1",
                "--wandb.mode", "disabled", "--executor.threads_per_worker", "1"]
#: the equality runs of a dry run (after the others, so they win): round 0 and one round (PTC), 2 clients in 2 groups,
#: one worker
DRY_EQUALITY = ["--rounds", "1", "--data.num_clients", "2", "--data.partitioner.init_args.num_groups", "2",
                "--data.test_samples_per_client", "20", "--executor.workers_per_device", "1"]
#: the determinism settings compared (flags after the default ones; a difference fails only where ``strict``)
SETTINGS = {"default flags": ([], False), "trainer.deterministic true": (["--trainer.deterministic", "true"], True)}
#: the executors compared; the parallel runs under an open-file limit of LOW_FILE_LIMIT (``low``)
KINDS = {"sequential": (["--executor.kind", "sequential"], False),
         "parallel": (["--executor.kind", "parallel", "--executor.workers_per_device", "2"], True)}
LOW_FILE_LIMIT = 1024
FIT = "import sys; from cosmos_pl.cli import main; sys.exit(main(sys.argv[1:]))"  # cosmos-pl, installed or not
# soft and hard, as `ulimit -n 1024` in a shell (cosmos-pl raises its soft limit up to the hard one); workers inherit
# it; the first line of the run's log says what the process has
FIT_LOW_LIMIT = (f"import resource; resource.setrlimit(resource.RLIMIT_NOFILE, ({LOW_FILE_LIMIT}, {LOW_FILE_LIMIT})); "
                 "print('open-file limit (soft, hard):', resource.getrlimit(resource.RLIMIT_NOFILE), flush=True); "
                 + FIT)


def write_standin(path: Path, train: int, test: int, classes: int = 100, size: int = 32, seed: int = 0) -> None:
    """Write a CIFAR-like set as ``NpzData`` reads it: x uint8 [N, size, size, 3], y int64 [N] (class
    ``i % classes`` for image i), ``classes`` names. Class c's images are its pattern (a 4x4x3 Gaussian field scaled
    up to size x size, pixel std 50 around 128) plus independent Gaussian pixel noise (std 40), clipped to 0..255.
    Written atomically (a temporary file, then renamed).

    Raises:
        ValueError: ``size`` is not a multiple of 4."""
    if size % 4:
        raise ValueError(f"size={size}: the stand-in's patterns are 4x4 scaled up; give a multiple of 4 (e.g. 32)")
    rng = np.random.default_rng(seed)
    up = size // 4
    patterns = np.repeat(np.repeat(rng.normal(0, 50, (classes, 4, 4, 3)), up, axis=1), up, axis=2) + 128

    def images(n: int) -> tuple[np.ndarray, np.ndarray]:
        y = np.arange(n, dtype=np.int64) % classes
        x = np.empty((n, size, size, 3), dtype=np.uint8)
        for start in range(0, n, 5_000):  # in chunks: a float copy of 50,000 images is 1.2 GB
            part = y[start:start + 5_000]
            noisy = patterns[part] + rng.normal(0, 40, (len(part), size, size, 3))
            x[start:start + 5_000] = np.clip(noisy, 0, 255).astype(np.uint8)
        return x, y

    x_train, y_train = images(train)
    x_test, y_test = images(test)
    tmp = path.with_name(path.name + ".tmp.npz")
    np.savez(tmp, x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test,
             classes=np.array([f"class_{c}" for c in range(classes)]))
    tmp.replace(path)


def cifar100_available(root: Path, download: bool = True) -> bool:
    """Whether torchvision loads CIFAR-100 from ``root`` (downloading it there if it can and ``download``)."""
    try:
        import torchvision

        torchvision.datasets.CIFAR100(str(root), train=True, download=download)
        return True
    except Exception as err:  # no network, a partial download, a checksum error: the stand-in takes over
        print(f"CIFAR-100 could not be loaded or downloaded ({type(err).__name__}: {err})")
        return False


def require_cuda() -> None:
    """Stop before anything runs where torch cannot use CUDA: the paper's round would run on the CPU for hours.

    Raises:
        ConfigError: one line saying why (:func:`cosmos_pl.training.cuda_check.cuda_unavailable_reason`: the
            driver against the torch wheel's CUDA, no NVIDIA GPU, a CPU-only torch) and the fix."""
    import torch

    from cosmos_pl.errors import ConfigError
    from cosmos_pl.training.cuda_check import cuda_unavailable_reason

    if not torch.cuda.is_available():
        raise ConfigError("CUDA is not available: " + cuda_unavailable_reason(
            otherwise="or check the script alone on the CPU with --dry-run"))


def check_settings(fit: list[str]) -> None:
    """Parse and check the run's settings as ``cosmos-pl fit`` does, before any data is fetched or tests run.

    Raises:
        ConfigError: a setting this benchmark fixes (:func:`paper_round.check_overrides`), or any bad setting.
        jsonargparse.ArgumentError: an unknown key or a wrong type."""
    from cosmos_pl.parsers import build_fit_parser
    from cosmos_pl.config import validate_config
    from paper_round import WARM_UP, check_overrides

    check_overrides(fit)
    parser = build_fit_parser()
    validate_config(parser.instantiate(parser.parse_args([*fit, *WARM_UP, "--run_dir", "unused"])))


def first_difference(a: Path, b: Path, files: tuple[str, ...] = ("metrics.csv", "clients.csv")) -> str | None:
    """Where two runs' records first differ (``metrics.csv line 3 (round=1), teacher_acc: 0.8123 against 0.8125``;
    a file of another length or header: its line counts or the headers), or None where every file is the same."""
    for name in files:
        x, y = (list(csv.reader((run / name).read_text().splitlines())) for run in (a, b))
        if x[:1] != y[:1]:
            return f"{name} header: {','.join(x[0] if x else [])} against {','.join(y[0] if y else [])}"
        for line, (u, v) in enumerate(zip(x[1:], y[1:]), start=2):
            if u != v:
                header = x[0]
                where = f" ({header[0]}={u[0]})" if header and u and v and u[0] == v[0] else ""
                col = next(i for i in range(max(len(u), len(v))) if i >= min(len(u), len(v)) or u[i] != v[i])
                field = header[col] if col < len(header) else f"column {col + 1}"
                got = [row[col] if col < len(row) else "(none)" for row in (u, v)]
                return f"{name} line {line}{where}, {field}: {got[0]} against {got[1]}"
        if len(x) != len(y):
            return f"{name}: {len(x)} lines against {len(y)}"
    return None


def _folder(work: Path, name: str) -> Path:  # "default flags, sequential" -> work/default_flags-sequential
    return work / name.replace(", ", "-").replace(" ", "_").replace(".", "_")


def _stop(procs: list[subprocess.Popen]) -> None:
    """SIGTERM to every process still running (cosmos-pl then stops its workers and exits 143), SIGKILL to any
    still running 30 s later."""
    running = [proc for proc in procs if proc.poll() is None]
    for proc in running:
        proc.terminate()
    end = time.monotonic() + 30
    for proc in running:
        try:
            proc.wait(timeout=max(0.1, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def equality(dry_run: bool, work: Path, deadline_s: float | None = None) -> dict:
    """The module docstring's ``--equality``: four ``cosmos-pl fit`` runs at once in ``work`` (each its folder and
    its ``.log``), a line per run (wall seconds, exit status; a failed run's last lines), a line per setting.

    Returns ``{"equality": {setting: "equal" | "differs: " first difference | "not compared ..."}, "runs": {name:
    {"seconds", "exit"}}, "parallel_open_file_limit": 1024, "passed": bool}``. A run still going after
    ``deadline_s`` seconds is stopped (SIGTERM, then SIGKILL) and counts as failed."""
    base = ["--config", str(REPO / "configs/digits_smoke.yaml"), *SMALL_DIGITS,
            "--trainer.accelerator", "auto" if dry_run else "gpu"]
    work.mkdir(parents=True, exist_ok=True)
    started, procs = time.monotonic(), {}
    for setting, (flags, _) in SETTINGS.items():
        for kind, (executor, low) in KINDS.items():
            name = f"{setting}, {kind}"
            args = [*base, *executor, *flags, *(DRY_EQUALITY if dry_run else []), "--run_dir",
                    str(_folder(work, name))]
            log = open(_folder(work, name).with_suffix(".log"), "w")
            procs[name] = (log, time.monotonic(), subprocess.Popen(
                [sys.executable, "-c", FIT_LOW_LIMIT if low else FIT, "fit", *args], cwd=work, stdout=log,
                stderr=subprocess.STDOUT))
    print(f"{len(procs)} small digits runs at once in {work}: sequential, and parallel under an open-file limit of "
          f"{LOW_FILE_LIMIT} (soft and hard), each under the default flags and under trainer.deterministic true")
    ended: dict[str, float] = {}  # each run's wall seconds, as it ends
    while len(ended) < len(procs):
        for name, (_, t0, proc) in procs.items():
            if name not in ended and proc.poll() is not None:
                ended[name] = round(time.monotonic() - t0, 1)
        if len(ended) < len(procs) and deadline_s is not None and time.monotonic() - started > deadline_s:
            _stop([proc for _, _, proc in procs.values()])
        else:
            time.sleep(0.2)
    results = {}
    for name, (log, _, proc) in procs.items():
        log.close()
        seconds = ended[name]
        results[name] = {"seconds": seconds, "exit": proc.returncode}
        lines = _folder(work, name).with_suffix(".log").read_text(errors="replace").splitlines()
        low = KINDS[name.split(", ")[-1]][1]
        limit = (lines[0] if lines else "(not printed)").removeprefix("open-file limit (soft, hard): ") if low else ""
        print(f"  {name}: {seconds} s, exit {proc.returncode}" + (f", open-file limit {limit}" if limit else ""))
        if proc.returncode:
            print("\n".join(f"    | {line}" for line in lines[-15:]))
    passed, compared = all(r["exit"] == 0 for r in results.values()), {}
    for setting, (_, strict) in SETTINGS.items():
        if any(results[f"{setting}, {kind}"]["exit"] for kind in KINDS):
            compared[setting] = "not compared (a run failed)"
        else:
            diff = first_difference(*(_folder(work, f"{setting}, {kind}") for kind in KINDS))
            compared[setting] = "equal" if diff is None else f"differs: {diff}"
            passed &= diff is None or not strict
        note = "" if strict or not compared[setting].startswith("differs") else (
            " (reported, not failed: not promised under the default flags, docs/execution.md#determinism)")
        print(f"sequential against parallel, {setting}: {compared[setting]}{note}")
    return {"equality": compared, "runs": results, "parallel_open_file_limit": LOW_FILE_LIMIT, "passed": passed}


def run(argv: list[str] | None = None) -> dict | None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="tiny sizes on any device; checks the script only")
    parser.add_argument("--check", action="store_true", help="only check the settings (gpu_check.sh does it first)")
    parser.add_argument("--data-dir", type=Path, default=REPO / "data", help="where CIFAR-100 or the stand-in goes")
    parser.add_argument("--run-dir", type=Path, default=None, help="the run's folder (default: a new temporary one)")
    parser.add_argument("--offline", action="store_true", help="no CIFAR-100 download (the stand-in unless on disk)")
    parser.add_argument("--equality", action="store_true", help="the sequential-parallel and open-file-limit runs")
    parser.add_argument("--deadline", type=float, default=None, help="--equality: stop its runs after this many s")
    args, overrides = parser.parse_known_args(argv)
    if args.run_dir is not None:  # the equality fits run in their own folder: a relative path would land there
        args.run_dir = args.run_dir.resolve()
    if not args.dry_run:
        require_cuda()
    if args.equality:
        work = (args.run_dir.with_name(args.run_dir.name + "-equality") if args.run_dir
                else Path(tempfile.mkdtemp(prefix="gpu_check-equality-")))
        result = equality(args.dry_run, work, args.deadline)
        print(json.dumps(result, sort_keys=True))
        return result
    settings = (DRY_RUN_SETTINGS if args.dry_run else []) + overrides
    check_settings(["--config", str(CONFIG), *settings])
    if args.check:
        return None
    args.data_dir.mkdir(parents=True, exist_ok=True)
    run_dir = args.run_dir or Path(tempfile.mkdtemp(prefix="gpu_check-"))
    fit = ["--config", str(CONFIG), "--data.dataset.init_args.root", str(args.data_dir)]
    if not args.dry_run and cifar100_available(args.data_dir, download=not args.offline):
        data = "CIFAR-100"
    else:
        sizes = DRY if args.dry_run else FULL
        standin = args.data_dir / "standin_{train}_{classes}_{size}.npz".format(**sizes)
        if not standin.is_file():
            write_standin(standin, **sizes)
        data = "stand-in: {train:,} + {test:,} {size}x{size}x3 images of {classes} class patterns".format(**sizes)
        fit = ["--config", str(CONFIG), "--data.dataset", "cosmos_pl.data.NpzData", "--data.dataset.path",
               str(standin)]
    from _common import emit
    from paper_round import print_figures, time_round

    print(f"data: {data}; the run's files go to {run_dir} (kept)")
    figures = time_round([*fit, *settings], run_dir)
    figures.update(data=data, dry_run=args.dry_run, config=str(CONFIG.relative_to(REPO)), overrides=overrides,
                   run_dir=str(run_dir), gpu_monitor=figures.pop("gpu_monitor"))
    print_figures(figures)
    emit(figures)
    return figures


def main(argv: list[str] | None = None) -> int:
    """Exit status: 0 done; 1 ``--equality`` failed; 2 no CUDA (unless ``--dry-run``), a bad setting or path, or
    with ``--offline --check`` a package this Python lacks (:func:`gpu_offline.check`, before anything imports it):
    one line on stderr (as ``cosmos-pl fit``)."""
    argv = sys.argv[1:] if argv is None else argv
    if "--offline" in argv and "--check" in argv:
        from gpu_offline import check

        if check():
            return 2
    from jsonargparse import ArgumentError

    from cosmos_pl.errors import UserError

    try:
        result = run(argv)
    except ArgumentError as err:
        print(f"gpu_check: error: {err} (options: cosmos-pl fit --help)", file=sys.stderr)
        return 2
    except (UserError, OSError) as err:  # OSError: a data or run folder that cannot be made or written
        print(f"gpu_check: error: {err}", file=sys.stderr)
        return 2
    return 1 if result is not None and result.get("passed") is False else 0


if __name__ == "__main__":
    sys.exit(main())

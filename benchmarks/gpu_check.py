"""One round of the paper's setup on the GPUs present, the body of ``benchmarks/gpu_check.sh`` (which runs the
``cuda`` tests first).

``python benchmarks/gpu_check.py [--dry-run] [--data-dir DIR] [--run-dir DIR] [cosmos-pl overrides ...]``

The setup is configs/cifar100.yaml as it is (COSMOS, Section 6 and Appendix C: 25 clients in 5 class groups,
MobileNetV2 and SqueezeNet clients, VGG16 cluster teachers, bf16-mixed), on CIFAR-100 where torchvision can load or
download it into the data folder. Otherwise on a same-shape stand-in (:func:`write_standin`): 50,000 + 10,000
32x32x3 uint8 images of 100 classes, each class a fixed smooth random pattern under pixel noise, which the
partitioner splits into the same 5 class groups. It is meant to be learnt quickly, so that the clustering finds
the groups as on CIFAR-100; that has not been checked at full size (no GPU here), and K and the adjusted Rand index
in the output say whether it did. ``--dry-run`` shrinks everything (1,000 + 200 stand-in images of 20 classes at
16x16, 10 clients, one epoch in round 0, timm's test backbones, float32, no download, ``trainer.accelerator auto``)
so that the script's logic finishes in seconds on a CPU; its timings and clusters mean nothing (its tiny models do
not find the groups). Without ``--dry-run`` it needs CUDA: where torch cannot use it, it exits with status 2 before
anything runs, saying why (the NVIDIA driver against the torch wheel's CUDA, no NVIDIA GPU) and how to fix it.

Round 0 trains with the config's epochs (10: clients must have learned their classes for the clustering to find
the groups), the PTC round with one (warm-up); round 2, an IFFT round with the config's epochs, is timed. The last
line printed is JSON: seconds per round and per stage, images per second per stage, per GPU the peak memory and
mean utilisation of every process on it, K and the adjusted Rand index, the data used.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import emit  # noqa: E402
from paper_round import WARM_UP, check_overrides, print_figures, time_round  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "configs/cifar100.yaml"
FULL = {"train": 50_000, "test": 10_000, "classes": 100, "size": 32}
DRY = {"train": 1_000, "test": 200, "classes": 20, "size": 16}
# tiny, offline and fast on one CPU core: the script's path, not the paper's numbers
DRY_RUN_SETTINGS = ["--data.num_clients", "10", "--clients.pretrain_epochs", "1",
                    "--data.test_samples_per_client", "10",
                    "--clients.backbones", "[test_efficientnet, lcnet_035]", "--clients.batch_size", "32",
                    "--algorithm.init_args.teacher_backbone", "test_efficientnet",
                    "--algorithm.init_args.teacher_batch_size", "32", "--algorithm.init_args.teacher_epochs", "1",
                    "--trainer.accelerator", "auto", "--trainer.precision", "32-true",
                    "--trainer.inference_batch_size", "256",
                    "--executor.threads_per_worker", "1"]


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


def cifar100_available(root: Path) -> bool:
    """Whether torchvision loads CIFAR-100 from ``root`` (downloading it there if it can)."""
    try:
        import torchvision

        torchvision.datasets.CIFAR100(str(root), train=True, download=True)
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

    check_overrides(fit)
    parser = build_fit_parser()
    validate_config(parser.instantiate(parser.parse_args([*fit, *WARM_UP, "--run_dir", "unused"])))


def run(argv: list[str] | None = None) -> dict | None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="tiny sizes on any device; checks the script only")
    parser.add_argument("--check", action="store_true", help="only check the settings (gpu_check.sh does it first)")
    parser.add_argument("--data-dir", type=Path, default=REPO / "data", help="where CIFAR-100 or the stand-in goes")
    parser.add_argument("--run-dir", type=Path, default=None, help="the run's folder (default: a new temporary one)")
    args, overrides = parser.parse_known_args(argv)
    if not args.dry_run:
        require_cuda()
    settings = (DRY_RUN_SETTINGS if args.dry_run else []) + overrides
    check_settings(["--config", str(CONFIG), *settings])
    if args.check:
        return None
    args.data_dir.mkdir(parents=True, exist_ok=True)
    run_dir = args.run_dir or Path(tempfile.mkdtemp(prefix="gpu_check-"))
    fit = ["--config", str(CONFIG), "--data.dataset.init_args.root", str(args.data_dir)]
    if not args.dry_run and cifar100_available(args.data_dir):
        data = "CIFAR-100"
    else:
        sizes = DRY if args.dry_run else FULL
        standin = args.data_dir / "standin_{train}_{classes}_{size}.npz".format(**sizes)
        if not standin.is_file():
            write_standin(standin, **sizes)
        data = "stand-in: {train:,} + {test:,} {size}x{size}x3 images of {classes} class patterns".format(**sizes)
        fit = ["--config", str(CONFIG), "--data.dataset", "cosmos_pl.data.NpzData", "--data.dataset.path",
               str(standin)]
    print(f"data: {data}; the run's files go to {run_dir} (kept)")
    figures = time_round([*fit, *settings], run_dir)
    figures.update(data=data, dry_run=args.dry_run, config=str(CONFIG.relative_to(REPO)), overrides=overrides,
                   run_dir=str(run_dir), gpu_monitor=figures.pop("gpu_monitor"))
    print_figures(figures)
    emit(figures)
    return figures


def main(argv: list[str] | None = None) -> int:
    """Exit status: 0 done; 2 no CUDA (unless ``--dry-run``), a bad setting or path: one line on stderr (as
    ``cosmos-pl fit``)."""
    from jsonargparse import ArgumentError

    from cosmos_pl.errors import UserError

    try:
        run(argv)
    except ArgumentError as err:
        print(f"gpu_check: error: {err} (options: cosmos-pl fit --help)", file=sys.stderr)
        return 2
    except (UserError, OSError) as err:  # OSError: a data or run folder that cannot be made or written
        print(f"gpu_check: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Time one IFFT round of a config: ``benchmarks/paper_round.py --config configs/cifar100.yaml [overrides]``.

Runs round 0 and the PTC round with one epoch each (warm-up, not timed; more in round 0 with
``--clients.pretrain_epochs``), then one IFFT round with the config's own epochs, and reports that round's
seconds, seconds and images per second per stage, and per GPU the peak memory and mean utilisation of every
process on it (``nvidia-smi``, sampled over the whole run). The last line is JSON. ``benchmarks/gpu_check.sh``
runs it on the paper's setup.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import emit  # noqa: E402
from gpu_monitor import GpuMonitor  # noqa: E402

# after the caller's settings, so that they win: the PTC round is warm-up, the IFFT round (2) is timed
WARM_UP = ["--algorithm.init_args.ptc_epochs", "1", "--rounds", "2", "--wandb.mode", "disabled"]


def check_overrides(argv: list[str]) -> None:
    """Refuse the settings :data:`WARM_UP` and the run folder fix, which would otherwise be silently overridden.

    Raises:
        ConfigError: naming the setting."""
    from cosmos_pl.errors import ConfigError

    fixed = {"--rounds", "--wandb.mode", "--algorithm.init_args.ptc_epochs", "--algorithm.ptc_epochs", "--run_dir"}
    given = sorted({a.split("=", 1)[0] for a in argv if a.split("=", 1)[0] in fixed})
    if given:
        raise ConfigError(f"{', '.join(given)}: fixed by this benchmark (rounds 0-2, the PTC round one epoch, no "
                          "W&B, its own run folder); leave them out (the run folder: --run-dir)")


def images_by_stage(cfg, run_dir: Path, summary: dict) -> dict[str, int]:
    """Images through each stage of the IFFT round; an image counts once per view (forward and backward once).

    Local training: every client's training images x local epochs; pseudo-labels: N x |U|; teacher distillation:
    K x |U| x teacher epochs x (1 + num_views); client distillation: N x |U| x distill epochs x (1 + num_views)
    (Algorithm 2's stages; views as in Eq. 1)."""
    sizes = json.loads((run_dir / "partition.json").read_text())["sizes"]
    n_pub, n_clients = summary["communication"]["public_samples"], summary["num_clients"]
    algo = cfg.algorithm.init_args
    views = 1 + algo.num_views
    k = summary["clusters"]["K"] or 0
    return {"local training": sum(sizes) * cfg.clients.local_epochs,
            "pseudo-labels": n_clients * n_pub,
            "teacher distillation": k * n_pub * algo.teacher_epochs * views,
            "client distillation": n_clients * n_pub * cfg.clients.distill_epochs * views}


def time_round(argv: list[str], run_dir: Path) -> dict:
    """Run ``cosmos-pl fit`` with ``argv`` (then :data:`WARM_UP`) into ``run_dir`` under a :class:`GpuMonitor`;
    return the IFFT round's figures: ``seconds_per_round``, ``seconds_by_stage``, ``images_per_round_by_stage``,
    ``images_per_second_by_stage``, ``gpus`` (see :meth:`GpuMonitor.report`), ``clusters`` (K and the adjusted Rand
    index against the true groups) and ``final`` (the teacher's and the client's mean personalized accuracy)."""
    from cosmos_pl.fit import run_fit
    from cosmos_pl.parsers import build_fit_parser

    check_overrides(argv)
    parser = build_fit_parser()
    cfg = parser.parse_args([*argv, *WARM_UP, "--run_dir", str(run_dir)])
    with GpuMonitor() as monitor:
        run_fit(cfg, parser)
    summary = json.loads((run_dir / "summary.json").read_text())
    stage_s = summary["stage_seconds_by_round"]["2"]
    images = images_by_stage(cfg, run_dir, summary)
    final = summary["final"]
    return {"seconds_per_round": summary["round_seconds"]["2"], "seconds_by_stage": stage_s,
            "images_per_round_by_stage": images,
            "images_per_second_by_stage": {s: round(n / stage_s[s], 1) for s, n in images.items() if stage_s.get(s)},
            "gpus": monitor.report(), "gpu_monitor": monitor.status,
            "clusters": {"K": summary["clusters"]["K"],
                         "adjusted_rand_index": summary["clusters"]["adjusted_rand_index"]},
            "final": {k: final[k]["mean"] for k in ("teacher_acc", "client_acc") if k in final}}


def print_figures(figures: dict) -> None:
    print(f"IFFT round: {figures['seconds_per_round']:.1f} s")
    for stage, n in figures["images_per_round_by_stage"].items():
        print(f"  {stage:22s} {n:>10,d} images in {figures['seconds_by_stage'].get(stage, 0):7.1f} s = "
              f"{figures['images_per_second_by_stage'].get(stage, 0):>10,.0f} images/s")
    for gpu in figures["gpus"]:
        print(f"  GPU {gpu['index']} ({gpu['name']}): peak {gpu['peak_memory_mib'] / 1024:.2f} of "
              f"{gpu['total_memory_mib'] / 1024:.0f} GiB, mean utilisation {gpu['mean_utilisation_percent']}%")
    if not figures["gpus"]:
        print(f"  no GPU seen ({figures['gpu_monitor']})")


def main() -> None:
    # round 0 is warm-up too here: one epoch (before the caller's settings, which may give more)
    run_dir = Path(tempfile.mkdtemp(prefix="paper_round-"))
    figures = time_round(["--clients.pretrain_epochs", "1", *sys.argv[1:]], run_dir)
    print_figures(figures)
    emit(figures)


if __name__ == "__main__":
    main()

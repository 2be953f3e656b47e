"""Time one IFFT round of a config: ``benchmarks/paper_round.py --config configs/cifar100.yaml [overrides]``.

Runs round 0 and the PTC round with one epoch each (warm-up, not timed), then one IFFT round with the
config's own epochs, and reports that round's seconds, images per second per stage and peak GPU memory.
The last line is JSON.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import emit  # noqa: E402

from cosmos_pl.cli import build_fit_parser, run_fit  # noqa: E402


def main() -> None:
    parser = build_fit_parser()
    run_dir = tempfile.mkdtemp(prefix="paper_round-")
    argv = sys.argv[1:] + ["--clients.pretrain_epochs", "1", "--algorithm.ptc_epochs", "1", "--rounds", "2",
                           "--wandb.mode", "disabled", "--run_dir", run_dir]
    cfg = parser.parse_args(argv)
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    summary = run_fit(cfg, parser)
    seconds = summary["round_seconds"]["2"]
    n_pub = summary["communication"]["public_samples"]
    n_clients = summary["num_clients"]
    algo = cfg.algorithm.init_args
    views = 1 + algo.num_views
    k = summary["clusters"]["K"]
    # images through each stage in the IFFT round (forward+backward counted once per image and view)
    sizes = json.loads((Path(run_dir) / "partition.json").read_text())["sizes"]
    images = {"local training": sum(sizes) * cfg.clients.local_epochs,
              "pseudo-labels": n_clients * n_pub,
              "teacher distillation": k * n_pub * algo.teacher_epochs * views,
              "client distillation": n_clients * n_pub * cfg.clients.distill_epochs * views}
    peak = max((torch.cuda.max_memory_allocated(i) for i in range(torch.cuda.device_count())), default=0)
    print(f"IFFT round: {seconds:.1f} s on {torch.cuda.device_count()} GPU(s); peak GPU memory {peak / 2**30:.2f} GiB")
    stage_s = summary["stage_seconds_by_round"]["2"]
    rates = {stage: round(n / stage_s[stage], 1) for stage, n in images.items() if stage_s.get(stage)}
    for stage, n in images.items():
        print(f"  {stage:22s} {n:>10,d} images in {stage_s.get(stage, 0):7.1f} s = {rates.get(stage, 0):>10,.0f} images/s")
    emit({"seconds_per_round": round(seconds, 2), "images_per_second_by_stage": rates,
          "images_per_round_by_stage": images, "peak_gpu_memory_bytes": int(peak),
          "note": "peak memory is this process's; with the parallel executor workers hold their own"})


if __name__ == "__main__":
    main()

"""cosmos-pl in the peers benchmark: ``cosmos-pl fit`` on benchmarks/peers/federation.yaml, run in this process
exactly as the console script runs it, with one addition: the time each round's evaluation ends is noted (a wrapper
around :meth:`cosmos_pl.federated.runner.Runner.evaluate`; it does no work of its own), and, with
``--profile_round N``, round N is profiled with cProfile.

    python benchmarks/peers/cosmos_adapter.py --spec JSON --algorithm fedavg|fedmd --run_dir DIR --out RECORD.json

The federation, the backbone and the training settings come from ``--spec`` (:class:`spec.Spec`) as ``fit``
flags over the config, so the partition is the one ``cosmos-pl export-partition`` writes for the other systems.
"""

from __future__ import annotations

import argparse
import cProfile
import csv
import json
import pstats
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from spec import Spec, versions, write_record  # noqa: E402

CONFIG = HERE / "federation.yaml"
ALGORITHMS = {"fedavg": "cosmos_pl.algorithms.FedAvg", "fedmd": "cosmos_pl.algorithms.FedMD"}


def fit_args(spec: Spec, algorithm: str, run_dir: Path) -> list[str]:
    """``cosmos-pl fit`` arguments that run ``algorithm`` on the benchmark's federation under ``spec``."""
    return ["fit", "--config", str(CONFIG), "--algorithm", ALGORITHMS[algorithm],
            "--seed", str(spec.seed), "--rounds", str(spec.rounds),
            "--clients.backbones", f"[{spec.backbone}]", "--clients.local_epochs", str(spec.local_epochs),
            "--clients.distill_epochs", str(spec.digest_epochs), "--clients.batch_size", str(spec.batch_size),
            "--clients.optimizer.lr", str(spec.lr), "--clients.distill_optimizer.lr", str(spec.lr),
            "--executor.threads_per_worker", str(spec.threads), "--run_dir", str(run_dir), "--overwrite", "true"]


def export_args(spec: Spec, out: Path) -> list[str]:
    """``cosmos-pl export-partition`` arguments writing the same federation (the partition depends on the seed)."""
    return ["export-partition", "--config", str(CONFIG), "--seed", str(spec.seed), "--out", str(out)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--spec", required=True, help="Spec(...).to_json() text")
    ap.add_argument("--algorithm", choices=sorted(ALGORITHMS), default="fedavg")
    ap.add_argument("--run_dir", required=True, type=Path)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--profile_round", type=int, default=0,
                    help="profile this round (training and evaluation) with cProfile; the 30 costliest calls by "
                    "cumulative time go to stdout and the whole profile to OUT.prof")
    a = ap.parse_args(argv)
    spec = Spec.from_json(a.spec)

    import torch

    from cosmos_pl.cli import main as cosmos_main
    from cosmos_pl.federated.runner import Runner

    torch.set_num_threads(spec.threads)
    ends: dict[int, float] = {}
    evaluate = Runner.evaluate

    train_round = Runner.train_round
    profiler = cProfile.Profile() if a.profile_round else None

    def started(self, rnd, *args, **kwargs):
        if profiler is not None and rnd == a.profile_round:
            profiler.enable()
        return train_round(self, rnd, *args, **kwargs)

    def timed(self, rnd, *args, **kwargs):
        out = evaluate(self, rnd, *args, **kwargs)
        ends[rnd] = time.time()
        if profiler is not None and rnd == a.profile_round:
            profiler.disable()
            profiler.dump_stats(str(a.out.with_suffix(".prof")))
            pstats.Stats(profiler).sort_stats("cumulative").print_stats(30)
        return out

    Runner.train_round, Runner.evaluate = started, timed
    code = cosmos_main(fit_args(spec, a.algorithm, a.run_dir))
    if code:
        return code
    with open(a.run_dir / "clients.csv") as f:
        last = [r for r in csv.DictReader(f) if int(r["round"]) == spec.rounds]
    with open(a.run_dir / "metrics.csv") as f:
        final = [r for r in csv.DictReader(f) if int(r["round"]) == spec.rounds][0]
    clients = len(last)
    moved = (int(final["upload_bytes_per_client"]) + int(final["download_bytes_per_client"])) * clients
    summary = json.loads((a.run_dir / "summary.json").read_text())
    write_record(a.out, system="cosmos-pl", algorithm=a.algorithm,
                 round_end_unix=[ends[r] for r in range(1, spec.rounds + 1)],
                 client_accuracy=[float(r["client_acc"]) for r in sorted(last, key=lambda r: int(r["client"]))],
                 bytes_per_round=moved, payload_bytes_per_round=moved,  # a client evaluates what it holds
                 extra={"versions": versions("cosmos-pl", "torch", "lightning", "timm"),
                        "round_seconds_own": summary.get("round_seconds")})
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Seconds per COSMOS round as the number of clients and the public set grow.

Clients: 10, 20 and 40, each with about 480 labelled images, 5 clients per class group (so K = N/5
teachers), |U| fixed: per-client work is constant, so seconds per client per round should stay flat.
Public set: |U| at 1x, 2x and 4x with 20 clients. One IFFT round each (local fine-tune, upload, teacher
fine-tune, client distillation). The last line is JSON with keys ``seconds_per_client_by_clients`` and
``seconds_per_round_by_public_size``.

    .venv/bin/python benchmarks/scaling.py [--public 600] [--executor sequential|parallel]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import build_runner, cosmos_round, emit  # noqa: E402

from cosmos_pl.execution.executor import ExecutorConfig  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--public", type=int, default=600, help="|U| at 1x")
    ap.add_argument("--executor", choices=["sequential", "parallel"], default="sequential")
    args = ap.parse_args()
    ex = ExecutorConfig(kind=args.executor)
    per_client = {}
    for n in (10, 20, 40):
        seconds = cosmos_round(build_runner(n, args.public, executor=ex))
        per_client[n] = round(seconds / n, 3)
        print(f"{n:3d} clients, |U| = {args.public}: {seconds:7.1f} s per round, {seconds / n:.3f} s per client", flush=True)
    by_public = {}
    for mult in (1, 2, 4):
        u = args.public * mult
        seconds = cosmos_round(build_runner(20, u, executor=ex))
        by_public[u] = round(seconds, 2)
        print(f" 20 clients, |U| = {u:5d}: {seconds:7.1f} s per round, {seconds / u * 1000:.2f} ms per public sample", flush=True)
    spread = max(per_client.values()) / min(per_client.values()) - 1
    us = sorted(by_public)
    slope = (by_public[us[-1]] - by_public[us[0]]) / (us[-1] - us[0])
    print(f"per-client time spread 10..40 clients: {spread * 100:.1f}%; slope {slope * 1000:.2f} ms per public sample per round")
    emit({"seconds_per_client_by_clients": per_client, "seconds_per_round_by_public_size": by_public,
          "per_client_spread": round(spread, 4), "seconds_per_public_sample": round(slope, 6)})


if __name__ == "__main__":
    main()

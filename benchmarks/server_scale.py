"""Seconds of COSMOS's server steps for hundreds of clients, and of the partitioner for 500 clients.

Server steps (Section 4.1): the client distance matrix (L1 over the uploads), B0 by the ``auto`` rule and
Algorithm 1, for N = 50, 200 and 500 clients uploading pseudo-labels on |U| = 10,000 public samples with M = 100
classes (softmax of 5 planted group centres plus per-client noise; the uploads alone take N * 4 MB). The
partitioner: GroupDirichlet (the paper's, 5 groups) and Dirichlet, both at alpha 0.01, for 500 clients over
50,000 labels of 100 classes (CIFAR-100's training split).

The last line is JSON with ``server_seconds_by_clients`` (keys: N as strings), ``partition_seconds_500_clients``
(the slower of the two partitioners) and the details. Target (issue 9): N = 500 under 10 s on the 2-core CPU.

    .venv/bin/python benchmarks/server_scale.py [--clients 50,200,500] [--public 10000] [--classes 100]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch
from sklearn.metrics import adjusted_rand_score

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import emit  # noqa: E402

from cosmos_pl.clustering import greedy_clustering, native, pairwise_distances, resolve_b0  # noqa: E402
from cosmos_pl.data.partition import dirichlet, group_dirichlet  # noqa: E402

GROUPS = 5


def uploads(n_clients: int, public: int, classes: int) -> torch.Tensor:
    """``[N, n, M]`` float32 pseudo-labels: client i = softmax(centre of group i % 5 + noise), filled client by
    client so that nothing larger than the result is allocated."""
    g = torch.Generator().manual_seed(0)
    centres = torch.randn(GROUPS, public, classes, generator=g) * 2.0
    out = torch.empty(n_clients, public, classes)
    for i in range(n_clients):
        out[i] = (centres[i % GROUPS] + torch.randn(public, classes, generator=g)).softmax(-1)
    return out


def server_steps(p: torch.Tensor) -> dict:
    start = time.perf_counter()
    d = pairwise_distances(p, "l1")
    t_dist = time.perf_counter() - start
    b0 = resolve_b0("auto", d)
    t_b0 = time.perf_counter() - start - t_dist
    clusters = greedy_clustering(d, b0)
    total = time.perf_counter() - start
    labels = np.empty(len(p), dtype=int)
    for k, members in enumerate(clusters):
        labels[members] = k
    ari = adjusted_rand_score(np.arange(len(p)) % GROUPS, labels)
    return {"seconds": round(total, 2), "distance_seconds": round(t_dist, 2), "auto_b0_seconds": round(t_b0, 2),
            "K": len(clusters), "b0": round(b0, 6), "adjusted_rand_index": round(float(ari), 4)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", default="50,200,500", help="comma-separated N")
    ap.add_argument("--public", type=int, default=10_000, help="|U|")
    ap.add_argument("--classes", type=int, default=100, help="M")
    args = ap.parse_args()
    sizes = [int(s) for s in args.clients.split(",")]
    print(f"compiled L1 kernel: {'yes' if native.load() is not None else 'no (torch fallback)'}", flush=True)
    start = time.perf_counter()
    p = uploads(max(sizes), args.public, args.classes)
    print(f"uploads [{max(sizes)}, {args.public}, {args.classes}] built in {time.perf_counter() - start:.1f} s "
          f"({p.numel() * 4 / 2**30:.2f} GiB)", flush=True)
    details = {}
    for n in sizes:
        details[str(n)] = server_steps(p[:n])
        r = details[str(n)]
        print(f"N = {n:4d}: {r['seconds']:6.2f} s (distances {r['distance_seconds']:.2f} s, auto B0 "
              f"{r['auto_b0_seconds']:.2f} s); K = {r['K']}, ARI {r['adjusted_rand_index']}", flush=True)
    del p
    labels = np.repeat(np.arange(100), 500)
    partition = {}
    for name, fn, kwargs in (("group_dirichlet", group_dirichlet, {"num_groups": GROUPS}), ("dirichlet", dirichlet, {})):
        start = time.perf_counter()
        part = fn(labels, 500, alpha=0.01, seed=0, **kwargs)
        partition[name] = round(time.perf_counter() - start, 3)
        print(f"{name}, 500 clients, alpha 0.01: {partition[name]:.3f} s (smallest client {part.sizes.min()})",
              flush=True)
    emit({"server_seconds_by_clients": {k: v["seconds"] for k, v in details.items()},
          "server_details_by_clients": details, "partition_seconds_500_clients": max(partition.values()),
          "partition_seconds_by_partitioner": partition, "public_samples": args.public, "classes": args.classes,
          "compiled_l1_kernel": native.load() is not None})


if __name__ == "__main__":
    main()

"""Seconds of COSMOS's clustering server step for thousands of clients, and of the partitioner for 500 clients.

The server step (Section 4.1, what ``COSMOS._cluster`` runs through :func:`cosmos_pl.clustering.cluster_inputs`): the
confidence floor, the client distances (L1 over the uploads, exact up to
:data:`cosmos_pl.clustering.distances.EXACT_BUDGET` absolute differences, else on a fixed subsample of U), each
client's spread, the default ``auto`` rule and the clustering's structure; for N = 50, 200, 500 and 2,000 clients
uploading pseudo-labels on |U| = 10,000 public samples with M = 100 classes (planted federations,
:func:`cosmos_pl.clustering.planted.planted_uploads`, overlap 0.75, 5 groups; the uploads alone take N * 4 MB).
Target: N = 2,000 under 30 s on the 2-core CPU.

Where the distances are estimated, the exact ones are computed too (outside the timing) for the error of the
estimate (mean and largest absolute difference, in the distance's units: [0, 2]) and for the ARI of ``auto`` on
each, against the planted groups and between the two clusterings.

``--clients 10000``: N = 10,000 is measured on the 256 public samples the estimate reads (its floor,
:data:`cosmos_pl.clustering.distances.MIN_ESTIMATE_SAMPLES`): the full uploads would take 40 GB, so only those rows
are built (what a server that keeps those rows of each upload holds); no exact comparison there.

The partitioner: GroupDirichlet (the paper's, 5 groups) and Dirichlet, both at alpha 0.01, for 500 clients over
50,000 labels of 100 classes (CIFAR-100's training split). The last line is JSON.

    .venv/bin/python benchmarks/server_scale.py [--clients 50,200,500,2000] [--public 10000] [--classes 100]
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np
from sklearn.metrics import adjusted_rand_score

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import emit  # noqa: E402

from cosmos_pl.clustering import (DEFAULT_CONFIDENCE_FLOOR, cluster_clients, cluster_inputs,  # noqa: E402
                                  native, public_samples_for, structure)
from cosmos_pl.clustering.distances import MIN_ESTIMATE_SAMPLES  # noqa: E402
from cosmos_pl.clustering.planted import planted_uploads  # noqa: E402
from cosmos_pl.data.partition import dirichlet, group_dirichlet  # noqa: E402

GROUPS, OVERLAP = 5, 0.75


def server_step(p) -> tuple[dict, np.ndarray, np.ndarray]:
    """Time what COSMOS's first server step runs on the uploads ``p`` ``[N, n, M]``: its inputs (the subsample of
    U, the confidence floor, the distances, the spread), the ``auto`` rule and the clustering's structure."""
    start = time.perf_counter()
    got = cluster_inputs(p, "l1", DEFAULT_CONFIDENCE_FLOOR)
    t_inputs = time.perf_counter() - start
    found = cluster_clients("auto", got.distances, got.uninformative)
    t_rule = time.perf_counter() - start - t_inputs
    structure(got.distances, found.labels)
    total = time.perf_counter() - start
    return ({"seconds": round(total, 2), "inputs_seconds": round(t_inputs, 2), "rule_seconds": round(t_rule, 2),
             "K": int(found.labels.max()) + 1, "public_samples_used": got.samples,
             "tempered_clients": len(got.tempered), "uninformative_clients": len(got.uninformative)},
            got.distances, found.labels)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", default="50,200,500,2000", help="comma-separated N (10000: the estimate's rows only)")
    ap.add_argument("--public", type=int, default=10_000, help="|U|")
    ap.add_argument("--classes", type=int, default=100, help="M")
    args = ap.parse_args()
    print(f"compiled L1 kernel: {'yes' if native.load() is not None else 'no (torch fallback)'}", flush=True)
    details = {}
    for n in [int(s) for s in args.clients.split(",")]:
        used = public_samples_for(n, args.public, args.classes)
        full = n * args.public * args.classes * 4 <= 12 * 2**30  # what fits beside the distances in 24 GiB
        samples = args.public if full else MIN_ESTIMATE_SAMPLES
        start = time.perf_counter()
        p, groups = planted_uploads(n, GROUPS, args.classes, samples, OVERLAP, seed=0)
        print(f"N = {n}: uploads [{n}, {samples}, {args.classes}] built in {time.perf_counter() - start:.1f} s "
              f"({p.numel() * 4 / 2**30:.2f} GiB)", flush=True)
        row, d, labels = server_step(p)
        row["adjusted_rand_index"] = round(float(adjusted_rand_score(groups, labels)), 4)
        if not full:
            row["note"] = (f"the {MIN_ESTIMATE_SAMPLES} public samples the estimate reads were built, not the "
                           f"{args.public:,} ({n * args.public * args.classes * 4 / 2**30:.0f} GiB)")
        elif used < args.public:  # the estimate against the exact distances (not timed)
            exact_inputs = cluster_inputs(p, "l1", DEFAULT_CONFIDENCE_FLOOR, budget=math.inf)
            exact = exact_inputs.distances
            err = np.abs(d - exact)[np.triu_indices(n, 1)]
            exact_labels = cluster_clients("auto", exact, exact_inputs.uninformative).labels
            row.update(estimate_mean_abs_error=round(float(err.mean()), 5), estimate_max_abs_error=round(float(err.max()), 5),
                       exact_adjusted_rand_index=round(float(adjusted_rand_score(groups, exact_labels)), 4),
                       estimate_vs_exact_clusters_ari=round(float(adjusted_rand_score(exact_labels, labels)), 4))
        details[str(n)] = row
        print(f"N = {n:5d}: {row['seconds']:6.2f} s (floor, distances and spread {row['inputs_seconds']:.2f} s on "
              f"{row['public_samples_used']:,} public samples, {row['tempered_clients']} clients re-tempered; auto "
              f"{row['rule_seconds']:.2f} s); K = {row['K']}, ARI {row['adjusted_rand_index']}"
              + (f"; estimate error mean {row['estimate_mean_abs_error']} max {row['estimate_max_abs_error']}, "
                 f"ARI on exact distances {row['exact_adjusted_rand_index']}, clusterings agree (ARI) "
                 f"{row['estimate_vs_exact_clusters_ari']}" if "estimate_mean_abs_error" in row else ""), flush=True)
        del p, d
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

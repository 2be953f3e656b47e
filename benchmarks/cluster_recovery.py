"""How well each clustering rule recovers the true groups, against the best Algorithm 1 threshold (the ceiling).

Two kinds of federation:

- **planted** (:func:`cosmos_pl.clustering.planted.planted_uploads`): N = 10, 20, 50, 100, 500 and 2,000 clients in
  5 class groups, M = 20, |U| = 200, at overlaps 0.25, 0.5, 0.75 and 1.0, 3 draws each;
- **real**: the PTC round's uploads of the configs, the round-0 models the configs train (a round-0 cache keeps them)
  and one soft upload on U, exactly what ``cosmos-pl fit`` clusters in its first round: fmnist_quickstart at 10, 20
  and 40 clients (seeds 0-4), digits_smoke (seeds 0-9), cifar10_subset (seeds 0-2). Their uploads are kept in
  ``--cache``; a rerun reads them.

Every case goes through what COSMOS's server step runs (:func:`cosmos_pl.clustering.cluster_inputs`), each rule on
the distance it reads by default: ``auto`` after the confidence floor (0.5), placing last the clients that upload one
distribution for every sample; the threshold rules on the paper's plain L1. The real uploads are also clustered on
``distance: l1_hard``.

Per case and rule (``auto``, the per-cluster default; ``strict``, ``silhouette`` and ``otsu``, the threshold rules,
these three only up to N = 500): the adjusted Rand index (ARI) against the true groups, K, how many clusters mix
clients of two groups, seconds. The ceiling is the best ARI Algorithm 1 reaches at any threshold on the same
distances (every distinct distance up to 2,048 of them; above, 64 evenly spaced among the sorted distances,
refined twice around the best), with its own mixing count. ``plain``: the ceiling and ``auto`` on the paper's plain
L1 (``confidence_floor: 0``). The ceiling reads the true groups; no rule does.

Checks printed at the end, against the better of the two ceilings (floor and plain): planted, auto's mean ARI within
0.1 of the ceiling's at every N (mean over overlaps and draws) and no draw where auto mixes groups and a ceiling does
not; fmnist_quickstart at 20 and 40 clients, a seed
passes when auto's ARI is at least 0.9, or within 0.05 of the ceiling where the ceiling is below 0.9 (4 of 5 seeds
required). The last line is JSON.

    .venv/bin/python benchmarks/cluster_recovery.py [--sizes 10,20,50,100,500,2000] [--draws 3] [--real all|none]
        [--cache ~/.cache/cosmos-pl/cluster_recovery]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
from sklearn.metrics import adjusted_rand_score

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import emit, ptc_uploads  # noqa: E402

from cosmos_pl.clustering import (DEFAULT_CONFIDENCE_FLOOR, cluster_clients, cluster_inputs,  # noqa: E402
                                  greedy_labels)
from cosmos_pl.clustering.native import cache_dir  # noqa: E402
from cosmos_pl.clustering.planted import planted_uploads  # noqa: E402

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
THRESHOLD_RULES_UP_TO = 500  # strict and silhouette search O(N^2 log N) in Python: minutes above this
REAL = (("fmnist_quickstart", 10, range(5)), ("fmnist_quickstart", 20, range(5)), ("fmnist_quickstart", 40, range(5)),
        ("digits_smoke", 0, range(10)), ("cifar10_subset", 0, range(3)))


def mixing(labels: np.ndarray, groups: np.ndarray) -> int:
    """Clusters holding clients of more than one true group."""
    return sum(len(set(groups[labels == k].tolist())) > 1 for k in np.unique(labels))


def ceiling(d: np.ndarray, groups: np.ndarray) -> tuple[float, float, np.ndarray]:
    """``(ARI, threshold, labels)`` of the best Algorithm 1 threshold (see the module docstring)."""
    values = np.unique(d[np.triu_indices(len(d), 1)])
    best = (-np.inf, 0.0, None)

    def consider(t: float) -> float:
        nonlocal best
        labels = greedy_labels(d, t)
        a = adjusted_rand_score(groups, labels)
        if a > best[0] + 1e-12:
            best = (a, float(t), labels)
        return a

    if len(values) <= 2048:
        for t in np.concatenate([[0.0], values]):
            consider(t)
        return best
    lo, hi = 0, len(values) - 1
    for _ in range(3):
        grid = np.unique(np.linspace(lo, hi, 64).astype(int))
        scores = [consider(values[i]) for i in grid]
        pos = int(np.argmax(scores))
        lo, hi = int(grid[max(pos - 1, 0)]), int(grid[min(pos + 1, len(grid) - 1)])
    return best


def _score(rule: str, d: np.ndarray, groups: np.ndarray, uninformative: list[int]) -> dict:
    start = time.perf_counter()
    found = cluster_clients(rule, d, uninformative)
    return {"ari": round(float(adjusted_rand_score(groups, found.labels)), 4), "K": int(found.labels.max()) + 1,
            "mixing": mixing(found.labels, groups), "seconds": round(time.perf_counter() - start, 3)}


def evaluate(uploads, groups: np.ndarray, metric: str = "l1") -> dict:
    """Every rule and the ceiling on one federation's uploads ``[N, n, M]``, read as COSMOS's server step reads
    them (:func:`cosmos_pl.clustering.cluster_inputs`; ``auto`` after the default confidence floor, the threshold
    rules on the plain distance, as each runs by default); under ``plain``, the ceiling and ``auto`` on the paper's
    plain distance
    (``confidence_floor: 0``)."""
    start = time.perf_counter()
    got = cluster_inputs(uploads, metric, DEFAULT_CONFIDENCE_FLOOR)
    inputs_seconds = time.perf_counter() - start
    d, uninformative = got.distances, got.uninformative
    a, t, labels = ceiling(d, groups)
    row = {"N": len(d), "ceiling": {"ari": round(a, 4), "b0": round(t, 4), "K": int(labels.max()) + 1,
                                    "mixing": mixing(labels, groups)},
           "uninformative": uninformative, "tempered": sorted(got.tempered), "inputs_seconds": round(inputs_seconds, 3)}
    plain = cluster_inputs(uploads, metric, 0.0) if got.tempered else got
    row["auto"] = _score("auto", d, groups, uninformative)
    if len(d) <= THRESHOLD_RULES_UP_TO:  # the threshold rules on the distance they read by default: the plain one
        for rule in ("strict", "silhouette", "otsu"):
            row[rule] = _score(rule, plain.distances, groups, plain.uninformative)
    pa, _, plabels = ceiling(plain.distances, groups)
    row["plain"] = {"ceiling": {"ari": round(pa, 4), "mixing": mixing(plabels, groups)},
                    "auto": _score("auto", plain.distances, groups, plain.uninformative)}
    return row


def line(name: str, row: dict) -> str:
    parts = [f"{name:<34}", f"ceiling {row['ceiling']['ari']:5.2f} K {row['ceiling']['K']:3d} "
             f"mix {row['ceiling']['mixing']}"]
    for rule in ("auto", "strict", "silhouette", "otsu"):
        if rule in row:
            r = row[rule]
            parts.append(f"{rule} {r['ari']:5.2f} K {r['K']:3d} mix {r['mixing']} {r['seconds']:.2f}s")
    p = row["plain"]
    parts.append(f"plain: ceiling {p['ceiling']['ari']:5.2f}, auto {p['auto']['ari']:5.2f} (mix {p['auto']['mixing']})")
    return " | ".join(parts)


def planted(sizes: list[int], overlaps: list[float], draws: int) -> dict:
    out: dict = {}
    for n in sizes:
        for overlap in overlaps:
            for draw in range(draws):
                uploads, groups = planted_uploads(n, overlap=overlap, seed=draw)
                row = evaluate(uploads, groups)
                out.setdefault(str(n), []).append({"overlap": overlap, "draw": draw, **row})
                print(line(f"planted N={n} overlap {overlap} draw {draw}", row), flush=True)
    return out


def real(cache: Path, round0: Path) -> dict:
    out: dict = {}
    for config, clients, seeds in REAL:
        name = f"{config}" + (f"@{clients}" if clients else "")
        for seed in seeds:
            uploads, groups = ptc_uploads(CONFIGS / f"{config}.yaml", seed, clients, cache, round0)
            row = evaluate(uploads, groups)
            row["l1_hard"] = evaluate(uploads, groups, "l1_hard")
            out.setdefault(name, []).append({"seed": seed, **row})
            print(line(f"{name} seed {seed}", row), flush=True)
            print(line(f"{name} seed {seed}, l1_hard", row["l1_hard"]), flush=True)
    return out


def best_ceiling(row: dict) -> float:
    """The ceiling the checks use: the better of the two, on the distances ``auto`` read and on the plain ones."""
    return max(row["ceiling"]["ari"], row["plain"]["ceiling"]["ari"])


def summary(planted_rows: dict, real_rows: dict) -> dict:
    checks: dict = {"planted": {}, "fmnist": {}}
    for n, rows in planted_rows.items():
        auto = float(np.mean([r["auto"]["ari"] for r in rows]))
        ceil = float(np.mean([best_ceiling(r) for r in rows]))
        mixed = [f"overlap {r['overlap']} draw {r['draw']}" for r in rows
                 if r["auto"]["mixing"] and not (r["ceiling"]["mixing"] and r["plain"]["ceiling"]["mixing"])]
        by_overlap = {str(o): (round(float(np.mean([r["auto"]["ari"] for r in rows if r["overlap"] == o])), 3),
                               round(float(np.mean([best_ceiling(r) for r in rows if r["overlap"] == o])), 3))
                      for o in sorted({r["overlap"] for r in rows})}
        checks["planted"][n] = {"auto_mean_ari": round(auto, 3), "ceiling_mean_ari": round(ceil, 3),
                                "within_0.1": auto >= ceil - 0.1, "mixed_where_ceiling_pure": mixed,
                                "by_overlap_auto_ceiling": by_overlap}
        verdict = "within" if auto >= ceil - 0.1 else "NOT within"
        print(f"planted N={n}: auto mean ARI {auto:.3f}, ceiling {ceil:.3f} ({verdict} 0.1); auto mixes where a "
              f"ceiling does not: {mixed or 'never'}; by overlap (auto, ceiling): {by_overlap}")
    for name, rows in real_rows.items():
        def mean(*keys: str) -> str:
            values = []
            for r in rows:
                for key in keys:
                    r = r[key]
                values.append(r)
            return f"{np.mean(values):.3f}"

        print(f"{name}: mean ARI, auto {mean('auto', 'ari')} (ceiling {mean('ceiling', 'ari')}); strict "
              f"{mean('strict', 'ari')}; plain distance: auto {mean('plain', 'auto', 'ari')} (ceiling "
              f"{mean('plain', 'ceiling', 'ari')}); distance l1_hard: auto {mean('l1_hard', 'auto', 'ari')} (ceiling "
              f"{mean('l1_hard', 'ceiling', 'ari')})")
    for name in ("fmnist_quickstart@20", "fmnist_quickstart@40"):
        if name not in real_rows:
            continue
        passed = [r["auto"]["ari"] >= 0.9 or (best_ceiling(r) < 0.9 and r["auto"]["ari"] >= best_ceiling(r) - 0.05)
                  for r in real_rows[name]]  # at least 0.9, or within 0.05 of a ceiling below 0.9
        checks["fmnist"][name] = {"seeds_passing": int(sum(passed)), "of": len(passed),
                                  "auto_ari": [r["auto"]["ari"] for r in real_rows[name]],
                                  "ceiling_ari": [best_ceiling(r) for r in real_rows[name]]}
        print(f"{name}: {sum(passed)} of {len(passed)} seeds pass (auto ARI {checks['fmnist'][name]['auto_ari']}, "
              f"ceiling {checks['fmnist'][name]['ceiling_ari']})")
    return checks


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="10,20,50,100,500,2000", help="planted N, comma-separated ('' for none)")
    ap.add_argument("--overlaps", default="0.25,0.5,0.75,1.0", help="planted overlaps")
    ap.add_argument("--draws", type=int, default=3, help="planted draws per N and overlap")
    ap.add_argument("--real", choices=("all", "none"), default="all", help="the configs' real PTC uploads")
    ap.add_argument("--cache", type=Path, default=cache_dir() / "cluster_recovery",
                    help="where the real distance matrices (and the round-0 models that make them) are kept")
    args = ap.parse_args()
    start = time.perf_counter()
    sizes = [int(s) for s in args.sizes.split(",") if s]
    planted_rows = planted(sizes, [float(o) for o in args.overlaps.split(",")], args.draws)
    real_rows = real(args.cache, args.cache / "round0") if args.real == "all" else {}
    checks = summary(planted_rows, real_rows)
    emit({"checks": checks, "planted": planted_rows, "real": real_rows,
          "seconds": round(time.perf_counter() - start, 1)})


if __name__ == "__main__":
    main()

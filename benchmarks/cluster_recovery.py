"""How well each clustering rule recovers the true groups, against the best Algorithm 1 threshold (the ceiling).

Two kinds of federation:

- **planted** (:func:`cosmos_pl.clustering.planted.planted_uploads`): N = 10, 20, 50, 100, 500 and 2,000 clients in
  5 class groups, |U| = 200, in seven families: M = 20 at overlaps 0.25, 0.5, 0.75 and 1.0, and three **loose**
  families whose groups are real but barely stand out (:data:`LOOSE`: competence spread over 0.55-0.95 with many
  foreign classes; heavy soft-label noise; M = 100 classes with weak clients, nearly all under the confidence floor);
  ``--draws`` draws each (default 4);
- **real**: the PTC round's uploads of the configs, the round-0 models the configs train (a round-0 cache keeps them)
  and one soft upload on U, exactly what ``cosmos-pl fit`` clusters in its first round (:data:`REAL`: Fashion-MNIST
  at 20, 40 and 80 clients, digits_smoke, the CIFAR-10 subset as shipped and at 40 and 80 clients with weak clients
  of four architectures: 2 and 1 pre-training epochs). Their uploads are kept in ``--cache``; a rerun reads them.

**Halves.** The settings of ``auto``'s keep rule (:mod:`cosmos_pl.clustering.chance`: 19 shuffles, alpha 0.05) were
chosen on the planted draws of even number (the *tuning* half); the checks read the draws of odd number (the
*held-out* half) and the real uploads, on which nothing was tuned. ``--alpha`` tries another alpha (the tuning
half's table says what each gives). Every line says its half.

Every case goes through what COSMOS's server step runs (:func:`cosmos_pl.clustering.cluster_inputs`), each rule on
the distance it reads by default: ``auto`` and ``silhouette_floor`` after the confidence floor (0.5), placing last
the clients that upload one distribution for every sample; ``strict`` on the paper's plain L1 (up to N = 500).

Per case and rule (``auto``, the default: the cut kept where it beats chance; ``silhouette_floor``, the keep rule
``auto`` had before: a mean silhouette of 0.2 and a persistence of 1.2; ``strict``): the adjusted Rand index (ARI)
against the true groups, K, how many clusters mix clients of two groups, seconds. The ceiling is the best ARI
Algorithm 1 reaches at any threshold on the same distances (every distinct distance up to 2,048 of them; above, 64
evenly spaced among the sorted distances, refined twice around the best), with its own mixing count. ``plain``: the
ceiling and ``auto`` on the paper's plain L1 (``confidence_floor: 0``). The ceiling reads the true groups; no rule
does.

Checks printed at the end, on the held-out half, against the better of the two ceilings (floor and plain): planted,
``auto``'s mean ARI within 0.1 of the ceiling's at every N (mean over families and draws, loose ones included) and
no draw where ``auto`` mixes groups and a ceiling does not; real, no case where ``auto``'s ARI is below
``silhouette_floor``'s. The last line is JSON.

    .venv/bin/python benchmarks/cluster_recovery.py [--sizes 10,20,50,100,500,2000] [--draws 4] [--real all|none|NAMES]
        [--cache ~/.cache/cosmos-pl/cluster_recovery] [--alpha 0.05]
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
from cosmos_pl.clustering import chance  # noqa: E402
from cosmos_pl.clustering.native import cache_dir  # noqa: E402
from cosmos_pl.clustering.planted import planted_uploads  # noqa: E402

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
THRESHOLD_RULES_UP_TO = 500  # strict searches O(N^2 log N) in Python: minutes above this
OVERLAPS = (0.25, 0.5, 0.75, 1.0)
#: The loose planted families: ``planted_uploads`` settings (5 groups, |U| = 200).
LOOSE = {
    "loose spread": dict(overlap=1.0, competence=(0.55, 0.95), foreign=0.5, noise=1.0),
    "loose noisy": dict(overlap=1.0, competence=(0.3, 0.8), foreign=0.4, noise=1.2),
    "loose many classes": dict(overlap=1.0, num_classes=100, competence=(0.2, 0.5), foreign=0.3, noise=1.0),
    "loose many classes, weak": dict(overlap=1.0, num_classes=100, competence=(0.3, 0.7), foreign=0.5, noise=1.2),
}
#: name: (config, N (0: the config's), seeds, more fit flags, cache tag)
REAL = {
    "fmnist_quickstart@20": ("fmnist_quickstart", 20, range(2), (), ""),
    "fmnist_quickstart@40": ("fmnist_quickstart", 40, range(2), (), ""),
    "fmnist_quickstart@80": ("fmnist_quickstart", 80, range(1), (), ""),
    "digits_smoke": ("digits_smoke", 0, range(3), (), ""),
    "cifar10_subset": ("cifar10_subset", 0, range(1), (), ""),
    "cifar10_subset@40 pretrain 2": ("cifar10_subset", 40, range(3), ("--clients.pretrain_epochs", "2"), "_e2"),
    "cifar10_subset@80 pretrain 1": ("cifar10_subset", 80, range(3), ("--clients.pretrain_epochs", "1"), "_e1"),
}
RULES = ("auto", "silhouette_floor", "strict")


def half(draw: int) -> str:
    """The planted draws of even number tuned the rule's settings; those of odd number are held out."""
    return "tuning" if draw % 2 == 0 else "held-out"


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
    them (:func:`cosmos_pl.clustering.cluster_inputs`; ``auto`` and ``silhouette_floor`` after the default
    confidence floor, ``strict`` on the plain distance, as each runs by default); under ``plain``, the ceiling and
    ``auto`` on the paper's plain distance (``confidence_floor: 0``)."""
    start = time.perf_counter()
    got = cluster_inputs(uploads, metric, DEFAULT_CONFIDENCE_FLOOR)
    inputs_seconds = time.perf_counter() - start
    d, uninformative = got.distances, got.uninformative
    a, t, labels = ceiling(d, groups)
    row = {"N": len(d), "ceiling": {"ari": round(a, 4), "b0": round(t, 4), "K": int(labels.max()) + 1,
                                    "mixing": mixing(labels, groups)},
           "uninformative": uninformative, "tempered": len(got.tempered), "inputs_seconds": round(inputs_seconds, 3)}
    plain = cluster_inputs(uploads, metric, 0.0) if got.tempered else got
    row["auto"] = _score("auto", d, groups, uninformative)
    row["silhouette_floor"] = _score("silhouette_floor", d, groups, uninformative)
    if len(d) <= THRESHOLD_RULES_UP_TO:  # strict on the distance it reads by default: the plain one
        row["strict"] = _score("strict", plain.distances, groups, plain.uninformative)
    pa, _, plabels = ceiling(plain.distances, groups)
    row["plain"] = {"ceiling": {"ari": round(pa, 4), "mixing": mixing(plabels, groups)},
                    "auto": _score("auto", plain.distances, groups, plain.uninformative)}
    return row


def line(name: str, row: dict) -> str:
    parts = [f"{name:<44}", f"ceiling {row['ceiling']['ari']:5.2f} K {row['ceiling']['K']:3d} "
             f"mix {row['ceiling']['mixing']}"]
    for rule in RULES:
        if rule in row:
            r = row[rule]
            parts.append(f"{rule} {r['ari']:5.2f} K {r['K']:3d} mix {r['mixing']} {r['seconds']:.2f}s")
    p = row["plain"]
    parts.append(f"plain: ceiling {p['ceiling']['ari']:5.2f}, auto {p['auto']['ari']:5.2f} (mix {p['auto']['mixing']})")
    return " | ".join(parts)


def families() -> list[tuple[str, dict]]:
    return [(f"overlap {o}", {"overlap": o}) for o in OVERLAPS] + list(LOOSE.items())


def planted(sizes: list[int], draws: int) -> dict:
    out: dict = {}
    for n in sizes:
        for family, settings in families():
            for draw in range(draws):
                uploads, groups = planted_uploads(n, seed=draw, **settings)
                row = evaluate(uploads, groups)
                out.setdefault(str(n), []).append({"family": family, "draw": draw, "half": half(draw), **row})
                print(line(f"[{half(draw)}] planted N={n} {family} draw {draw}", row), flush=True)
    return out


def real(names: list[str], cache: Path, round0: Path) -> dict:
    out: dict = {}
    for name in names:
        config, clients, seeds, extra, tag = REAL[name]
        for seed in seeds:
            uploads, groups = ptc_uploads(CONFIGS / f"{config}.yaml", seed, clients, cache, round0, extra, tag)
            row = evaluate(uploads, groups)
            out.setdefault(name, []).append({"seed": seed, **row})
            print(line(f"[held-out] {name} seed {seed}", row), flush=True)
    return out


def best_ceiling(row: dict) -> float:
    """The ceiling the checks use: the better of the two, on the distances ``auto`` read and on the plain ones."""
    return max(row["ceiling"]["ari"], row["plain"]["ceiling"]["ari"])


def summary(planted_rows: dict, real_rows: dict) -> dict:
    checks: dict = {"planted": {}, "real": {}}
    for part in ("tuning", "held-out"):
        for n, rows in planted_rows.items():
            rows = [r for r in rows if r["half"] == part]
            if not rows:
                continue
            mean = {rule: float(np.mean([r[rule]["ari"] for r in rows])) for rule in ("auto", "silhouette_floor")}
            ceil = float(np.mean([best_ceiling(r) for r in rows]))
            mixed = [f"{r['family']} draw {r['draw']}" for r in rows
                     if r["auto"]["mixing"] and not (r["ceiling"]["mixing"] and r["plain"]["ceiling"]["mixing"])]
            by_family = {f: (round(float(np.mean([r["auto"]["ari"] for r in rows if r["family"] == f])), 3),
                             round(float(np.mean([r["silhouette_floor"]["ari"] for r in rows if r["family"] == f])), 3),
                             round(float(np.mean([best_ceiling(r) for r in rows if r["family"] == f])), 3))
                         for f, _ in families() if any(r["family"] == f for r in rows)}
            entry = {"auto_mean_ari": round(mean["auto"], 3), "silhouette_floor_mean_ari": round(mean["silhouette_floor"], 3),
                     "ceiling_mean_ari": round(ceil, 3), "within_0.1": mean["auto"] >= ceil - 0.1,
                     "mixed_where_ceiling_pure": mixed, "by_family_auto_floor_ceiling": by_family}
            checks["planted"].setdefault(part, {})[n] = entry
            verdict = "within" if entry["within_0.1"] else "NOT within"
            print(f"[{part}] planted N={n}: auto mean ARI {mean['auto']:.3f}, silhouette_floor "
                  f"{mean['silhouette_floor']:.3f}, ceiling {ceil:.3f} (auto {verdict} 0.1); auto mixes where a "
                  f"ceiling does not: {mixed or 'never'}; by family (auto, silhouette_floor, ceiling): {by_family}")
    for name, rows in real_rows.items():
        worse = [r["seed"] for r in rows if r["auto"]["ari"] < r["silhouette_floor"]["ari"] - 1e-9]
        checks["real"][name] = {
            "auto": [(r["auto"]["K"], r["auto"]["ari"]) for r in rows],
            "silhouette_floor": [(r["silhouette_floor"]["K"], r["silhouette_floor"]["ari"]) for r in rows],
            "ceiling": [best_ceiling(r) for r in rows], "auto_worse_seeds": worse}
        c = checks["real"][name]
        print(f"[held-out] {name}: (K, ARI) per seed: auto {c['auto']}, silhouette_floor {c['silhouette_floor']}, "
              f"ceiling ARI {c['ceiling']}; seeds where auto is below silhouette_floor: {worse or 'none'}")
    return checks


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="10,20,50,100,500,2000", help="planted N, comma-separated ('' for none)")
    ap.add_argument("--draws", type=int, default=4, help="planted draws per N and family (even: tuning, odd: held out)")
    ap.add_argument("--real", default="all", help="the real cases: all, none, or names of REAL, comma-separated")
    ap.add_argument("--cache", type=Path, default=cache_dir() / "cluster_recovery",
                    help="where the real distance matrices (and the round-0 models that make them) are kept")
    ap.add_argument("--alpha", type=float, default=chance.ALPHA, help="auto's permutation-test level (a trial)")
    args = ap.parse_args()
    chance.ALPHA = args.alpha
    print(f"auto: {chance.SHUFFLES} shuffles, alpha {chance.ALPHA}")
    start = time.perf_counter()
    sizes = [int(s) for s in args.sizes.split(",") if s]
    planted_rows = planted(sizes, args.draws)
    names = list(REAL) if args.real == "all" else [] if args.real == "none" else args.real.split(",")
    unknown = [n for n in names if n not in REAL]
    if unknown:
        ap.error(f"--real {unknown}: not in {list(REAL)}")
    real_rows = real(names, args.cache, args.cache / "round0")
    checks = summary(planted_rows, real_rows)
    emit({"checks": checks, "planted": planted_rows, "real": real_rows, "alpha": chance.ALPHA,
          "seconds": round(time.perf_counter() - start, 1)})


if __name__ == "__main__":
    main()

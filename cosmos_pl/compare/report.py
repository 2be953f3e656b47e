"""The comparison report: accuracy over seeds, the † and ‡ marks, the accuracy-per-round figure, communication.

Conventions (COSMOS paper, Table 2): a number is the final-round (or best-round) mean personalized accuracy over
clients, averaged over seeds; its ± is the SEM of the per-seed means. A † marks a baseline whose SEM interval
[mean - SEM, mean + SEM] does not overlap COSMOS's. Because every algorithm of a seed shares that seed's partition
and round-0 models, the report also gives the paired difference (COSMOS minus the baseline, final round, per seed):
its mean ± SEM over the seeds both finished, and its 95% confidence interval, mean ± t(0.975, n - 1) * SEM (Student
t over the n per-seed differences); a ‡ marks a baseline whose interval excludes 0. The seed-to-seed spread of the
partition itself cancels in the paired difference, so ‡ can hold where † does not.

Every mark carries the sign of COSMOS minus the baseline, as the "COSMOS - this" column does: ``+†`` COSMOS above
the baseline, ``-†`` COSMOS below it; ``+‡`` the paired interval lies above 0, ``-‡`` below. On the COSMOS row a
mark means the same against every baseline (``+†``: above all of them, no interval overlapping). A short legend
stands under each table.

With fewer than 2 seeds there is no SEM and no interval ("n/a") and no mark: one seed says nothing about the
spread.

For an algorithm that clusters (COSMOS, COMET) the tables also say how: K per seed and its mean, the seeds whose
clustering showed weak structure (COSMOS: :attr:`cosmos_pl.clustering.Structure.weak`), the adjusted Rand index
against the true groups where the run is a simulation, and in words every seed where COSMOS kept no cluster (K = N,
every client distilling a teacher of its own), so a COSMOS row level with local-only says why. The headline metric (``headline_metric``: top-1, or top-5 as the paper reports Tiny ImageNet) decides every
number and mark; the other metric's final round stands beside it where the runs recorded it.
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from cosmos_pl.files import atomic_write_text
from cosmos_pl.report import METRIC_LABEL, mean_sem, round_figure, save_round_figure

__all__ = ["PairResult", "AlgorithmRow", "summarize", "marks", "overlaps", "paired_interval", "write_report",
           "comparison_markdown", "communication_markdown", "clustering_of", "Clustering", "plus_minus"]

_OTHER = {"top1": "top5", "top5": "top1"}


@dataclass
class PairResult:
    """One finished (or failed) (algorithm, seed) run.

    Attributes:
        algorithm, seed: the pair.
        rounds: per-round mean personalized top-1 accuracy over clients, index = round (0 = local-only).
        scored_model: which model the numbers come from ("cluster teacher h_pi(i)" or "client model f_i").
        communication: the run's summary["communication"].
        error: why the pair failed (None when it finished).
        rounds_top5: the same for top-5 accuracy (empty when the run did not record it: fewer than 20 classes).
        rounds_val: the same for top-1 accuracy on the clients' validation splits (empty without one): what a
            setting is chosen on.
        clusters: how the run clustered (:func:`clustering_of`), None for an algorithm without clusters.
    """

    algorithm: str
    seed: int
    rounds: list[float] = field(default_factory=list)
    scored_model: str = ""
    communication: dict[str, Any] = field(default_factory=dict)
    error: Optional[str] = None
    rounds_top5: list[float] = field(default_factory=list)
    rounds_val: list[float] = field(default_factory=list)
    clusters: Optional[dict[str, Any]] = None

    def series(self, metric: str) -> list[float]:
        """Per-round mean personalized accuracy in ``metric`` (``top1`` or ``top5``)."""
        return self.rounds if metric == "top1" else self.rounds_top5


@dataclass
class AlgorithmRow:
    """One algorithm over its seeds: final and best round, mean ± SEM (and n) of the per-seed means, in the headline
    metric; ``other_final``: the final round in the other metric, ``val_final``: the final round's top-1 accuracy on
    the validation splits (each None where not recorded)."""

    algorithm: str
    scored_model: str
    seeds: list[int]
    final: dict[str, float]
    best: dict[str, float]
    local_only: dict[str, float]
    failed: list[str]
    dagger: int = 0  # † with its sign: +1 the reference above this row, SEM intervals apart; -1 below; 0 no mark
    paired: Optional[dict[str, float]] = None  # reference minus this row, final round, paired by seed (with its CI)
    paired_above_zero: bool = False  # the paired 95% interval lies above 0 (+‡)
    paired_below_zero: bool = False  # ... below 0 (-‡): the reference is below this row
    other_final: Optional[dict[str, float]] = None
    val_final: Optional[dict[str, float]] = None
    clustering: Optional[Clustering] = None


def clustering_of(summary: dict[str, Any]) -> Optional[dict[str, Any]]:
    """A run's clustering from its summary.json: ``{"K", "N", "weak", "ari"}`` (``weak`` None where the algorithm
    reports no structure, ``ari`` None outside a simulation), or None for an algorithm that does not cluster."""
    info = summary.get("clusters") or {}
    if info.get("K") is None:
        return None
    structure = info.get("structure") or {}
    return {"K": int(info["K"]), "N": len(info.get("assignment") or []) or summary.get("num_clients"),
            "weak": structure.get("weak"), "ari": info.get("adjusted_rand_index")}


@dataclass
class Clustering:
    """How an algorithm's runs clustered, seed by seed (in the order of :attr:`AlgorithmRow.seeds`)."""

    K: list[int]
    N: list[int]
    weak: list[Optional[bool]]
    ari: list[Optional[float]]
    seeds: list[int]

    @property
    def alone_seeds(self) -> list[int]:
        """Seeds where no two clients shared a cluster (K = N)."""
        return [s for s, k, n in zip(self.seeds, self.K, self.N) if n and k == n]

    @property
    def weak_seeds(self) -> list[int]:
        return [s for s, w in zip(self.seeds, self.weak) if w]

    def cell(self) -> str:
        """``K 5.0 (5, 5, 10*); ARI 0.93 (1.00, 0.80, 0.00)``: * marks a seed with weak structure."""
        ks = ", ".join(f"{k}{'*' if w else ''}" for k, w in zip(self.K, self.weak))
        text = f"K {sum(self.K) / len(self.K):.1f} ({ks})"
        if all(a is not None for a in self.ari):
            text += f"; ARI {sum(self.ari) / len(self.ari):.2f} ({', '.join(f'{a:.2f}' for a in self.ari)})"
        return text


def overlaps(a: dict[str, float], b: dict[str, float]) -> bool:
    """Whether the intervals [mean - sem, mean + sem] of ``a`` and ``b`` overlap (touching counts as overlap)."""
    return a["mean"] - a["sem"] <= b["mean"] + b["sem"] and b["mean"] - b["sem"] <= a["mean"] + a["sem"]


def paired_interval(differences: list[float], level: float = 0.95) -> dict[str, float]:
    """Mean, SEM, n and the ``level`` confidence interval (``low``, ``high``) of per-seed differences: mean ±
    t((1 + level) / 2, n - 1) * SEM, Student t with n - 1 degrees of freedom; the interval is NaN for n < 2."""
    from scipy.stats import t

    stats = mean_sem(differences)
    if stats["n"] < 2:
        return {**stats, "low": math.nan, "high": math.nan}
    half = float(t.ppf((1 + level) / 2, stats["n"] - 1)) * stats["sem"]
    return {**stats, "low": stats["mean"] - half, "high": stats["mean"] + half}


def _spread(stats: dict[str, float]) -> bool:
    """Whether ``stats`` rest on at least 2 seeds (an SEM that says something)."""
    return stats.get("n", 0) >= 2


def summarize(pairs: list[PairResult], reference: str = "cosmos", metric: str = "top1") -> list[AlgorithmRow]:
    """Group pairs by algorithm (in first-seen order) and mark † and ‡ against ``reference``, in ``metric``.

    Per seed, final = the last round's mean personalized accuracy, best = the highest over rounds >= 1; over seeds,
    mean, SEM (sample std / sqrt(S)) and n. Each mark has the sign of the reference minus the row
    (:attr:`AlgorithmRow.dagger` +1 or -1; :attr:`AlgorithmRow.paired_above_zero` or ``paired_below_zero``); the
    reference's row gets a mark where every other row has it with the same sign. Rows with fewer than 2 seeds get no
    mark, nor does the reference when it has fewer. Failed pairs are listed, not averaged.
    """
    order: list[str] = []
    for p in pairs:
        if p.algorithm not in order:
            order.append(p.algorithm)
    rows = []
    for name in order:
        done = [p for p in pairs if p.algorithm == name and p.error is None and len(p.series(metric)) > 1]
        failed = [f"seed {p.seed}: {p.error}" for p in pairs if p.algorithm == name and p.error is not None]
        nan = {"mean": math.nan, "sem": math.nan, "n": 0}
        other = [p.series(_OTHER[metric]) for p in done]
        val = [p.rounds_val for p in done]
        rows.append(AlgorithmRow(
            algorithm=name, scored_model=done[0].scored_model if done else "", seeds=[p.seed for p in done],
            final=mean_sem([p.series(metric)[-1] for p in done]) if done else nan,
            best=mean_sem([max(p.series(metric)[1:]) for p in done]) if done else nan,
            local_only=mean_sem([p.series(metric)[0] for p in done]) if done else nan,
            failed=failed,
            other_final=mean_sem([o[-1] for o in other]) if done and all(len(o) > 1 for o in other) else None,
            val_final=mean_sem([v[-1] for v in val]) if done and all(len(v) > 1 for v in val) else None,
            clustering=Clustering([p.clusters["K"] for p in done], [p.clusters["N"] for p in done],
                                  [p.clusters["weak"] for p in done], [p.clusters["ari"] for p in done],
                                  [p.seed for p in done]) if done and all(p.clusters for p in done) else None))
    ref = next((r for r in rows if r.algorithm == reference and r.seeds), None)
    if ref is not None:
        others = [r for r in rows if r is not ref and r.seeds]
        final_of = {(p.algorithm, p.seed): p.series(metric)[-1] for p in pairs
                    if p.error is None and len(p.series(metric)) > 1}
        for r in others:
            if _spread(ref.final) and _spread(r.final) and not overlaps(ref.final, r.final):
                r.dagger = 1 if ref.final["mean"] > r.final["mean"] else -1
            common = [s for s in r.seeds if s in ref.seeds]
            if common:
                r.paired = paired_interval([final_of[(reference, s)] - final_of[(r.algorithm, s)] for s in common])
                r.paired_above_zero = _spread(r.paired) and r.paired["low"] > 0
                r.paired_below_zero = _spread(r.paired) and r.paired["high"] < 0
        signs = {r.dagger for r in others}
        ref.dagger = signs.pop() if len(signs) == 1 else 0
        ref.paired_above_zero = bool(others) and all(r.paired_above_zero for r in others)
        ref.paired_below_zero = bool(others) and all(r.paired_below_zero for r in others)
    return rows


def marks(row: AlgorithmRow) -> str:
    """The row's marks, each signed as COSMOS minus the row, space-separated: ``+†`` or ``-†``, then ``+‡`` or
    ``-‡``; ``""`` without a mark."""
    out = [f"{'+' if row.dagger > 0 else '-'}†"] if row.dagger else []
    out += ["+‡"] if row.paired_above_zero else ["-‡"] if row.paired_below_zero else []
    return " ".join(out)


def plus_minus(stats: Optional[dict[str, float]]) -> str:
    """``mean ± SEM`` of ``stats`` to 4 places; ``mean ± n/a`` without a spread (one seed), ``-`` without a mean."""
    if stats is None or math.isnan(stats["mean"]):
        return "-"
    return f"{stats['mean']:.4f} ± {stats['sem']:.4f}" if _spread(stats) else f"{stats['mean']:.4f} ± n/a"


def _interval(stats: Optional[dict[str, float]]) -> str:
    if stats is None:
        return "-"
    return "n/a" if math.isnan(stats["high"]) else f"[{stats['low']:+.4f}, {stats['high']:+.4f}]"


def comparison_markdown(rows: list[AlgorithmRow], title: str, metric: str = "top1") -> str:
    """comparison.md: the table (a row per algorithm, its marks beside its name: :func:`marks`), then a short legend
    under it, the sentences on clusterings that fell back, and the failed pairs."""
    label, other = METRIC_LABEL[metric], METRIC_LABEL[_OTHER[metric]]
    few = [r.algorithm for r in rows if r.seeds and not _spread(r.final)]
    lines = [f"# {title}", "", f"Headline metric: {label} accuracy.", "",
             f"| algorithm | scored model | seeds | final round ({label}) | best round | local-only (round 0) | "
             f"COSMOS - this | 95% interval | final round ({other}) | validation (top-1) | clusters |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        name = f"{r.algorithm} {marks(r)}".strip()
        seeds = ",".join(map(str, r.seeds)) or "-"
        lines.append(f"| {name} | {r.scored_model or '-'} | {seeds} | {plus_minus(r.final)} | {plus_minus(r.best)} | "
                     f"{plus_minus(r.local_only)} | {plus_minus(r.paired)} | {_interval(r.paired)} | "
                     f"{plus_minus(r.other_final)} | {plus_minus(r.val_final)} | "
                     f"{r.clustering.cell() if r.clustering else '-'} |")
    lines += ["", "Mean personalized accuracy over clients, mean ± SEM over seeds. Marks, signed as COSMOS - this: "
              "+† / -† COSMOS above / below this baseline, SEM intervals apart (the paper's †, unpaired); +‡ / -‡ "
              "COSMOS - this, paired by seed (same partition and round 0), has its 95% interval (Student t) above / "
              "below 0; on COSMOS, the same against every baseline. Best round: never used to choose; validation: "
              "what a setting is chosen on; clusters: K per seed (* weak structure), adjusted Rand index against the "
              "true groups."]
    if few:
        lines += ["", f"With fewer than 2 seeds ({', '.join(few)}) there is no SEM and no interval (n/a) and no mark: "
                  "one seed says nothing about the seed-to-seed spread."]
    said = [_fallback_words(r) for r in rows if r.clustering and (r.clustering.alone_seeds or r.clustering.weak_seeds)]
    if said:
        lines += [""] + [f"- {words}" for words in said]
    failures = [(r.algorithm, f) for r in rows for f in r.failed]
    if failures:
        lines += ["", "Failed pairs (not averaged):", ""]
        lines += [f"- {alg}, {f}" for alg, f in failures]
    return "\n".join(lines) + "\n"


def _fallback_words(r: AlgorithmRow) -> str:
    """The sentence under the table for a clustering row whose runs fell back or showed weak structure."""
    c = r.clustering
    parts = []
    if c.alone_seeds:
        seeds = ", ".join(map(str, c.alone_seeds))
        what = ("every client distilled a teacher of its own, so this row shows teachers of one client each, not "
                "cluster teachers") if r.scored_model.startswith("cluster teacher") else \
            "no client's model was averaged with another's"
        parts.append(f"seed{'s' if len(c.alone_seeds) > 1 else ''} {seeds}: no two clients shared a cluster "
                     f"(K = N): {what}")
    others = [s for s in c.weak_seeds if s not in c.alone_seeds]
    if others:
        parts.append(f"seed{'s' if len(others) > 1 else ''} {', '.join(map(str, others))}: weak cluster structure "
                     "(the run's clusters.json says why)")
    return f"{r.algorithm}, " + "; ".join(parts) + "."


def _csv(rows: list[AlgorithmRow], metric: str = "top1") -> str:
    def num(stats: Optional[dict[str, float]], key: str) -> str:
        if stats is None or math.isnan(stats.get(key, math.nan)) or (key != "mean" and not _spread(stats)):
            return ""  # n/a: no SEM or interval from fewer than 2 seeds
        return f"{stats[key]:.6f}"

    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["algorithm", "scored_model", "headline_metric", "seeds", "final_mean", "final_sem", "best_mean",
                "best_sem", "local_only_mean", "local_only_sem", "dagger", "failed_pairs", "paired_diff_mean",
                "paired_diff_sem", "paired_diff_ci95_low", "paired_diff_ci95_high", "paired_above_zero",
                "paired_below_zero",
                f"final_{_OTHER[metric]}_mean", f"final_{_OTHER[metric]}_sem", "final_val_top1_mean",
                "final_val_top1_sem", "clusters_K_mean", "clusters_K_per_seed", "clusters_weak_seeds",
                "clusters_alone_seeds", "clusters_ari_mean", "clusters_ari_per_seed"])
    for r in rows:
        w.writerow([r.algorithm, r.scored_model, metric, " ".join(map(str, r.seeds)),
                    num(r.final, "mean"), num(r.final, "sem"), num(r.best, "mean"), num(r.best, "sem"),
                    num(r.local_only, "mean"), num(r.local_only, "sem"), int(r.dagger), len(r.failed),
                    num(r.paired, "mean"), num(r.paired, "sem"), num(r.paired, "low"), num(r.paired, "high"),
                    int(r.paired_above_zero), int(r.paired_below_zero), num(r.other_final, "mean"),
                    num(r.other_final, "sem"),
                    num(r.val_final, "mean"), num(r.val_final, "sem"), *_cluster_cells(r.clustering)])
    return buf.getvalue()


def _cluster_cells(c: Optional[Clustering]) -> list[str]:
    if c is None:
        return [""] * 6
    known = all(a is not None for a in c.ari)
    return [f"{sum(c.K) / len(c.K):.6f}", " ".join(map(str, c.K)), " ".join(map(str, c.weak_seeds)),
            " ".join(map(str, c.alone_seeds)), f"{sum(c.ari) / len(c.ari):.6f}" if known else "",
            " ".join(f"{a:.6f}" for a in c.ari) if known else ""]


def communication_markdown(pairs: list[PairResult]) -> str:
    """Bytes per client per round and in total for each algorithm, beside FedAvg's parameter bytes for the same
    clients (float32 parameters each way per round; the paper's Table 4)."""
    lines = ["# Communication per client", "",
             "Bytes are the exact sizes of what is sent. FedAvg column: what parameter averaging would move for the same "
             "clients (float32 parameters up and down each round; mean over clients).", "",
             "| algorithm | rounds | up per round | down per round | total up + down | FedAvg parameters, total up + down |",
             "| --- | --- | --- | --- | --- | --- |"]
    seen = set()
    for p in pairs:
        if p.error is not None or p.algorithm in seen or not p.communication:
            continue
        seen.add(p.algorithm)
        c = p.communication
        rounds = c["rounds"]
        params = c.get("parameter_bytes_per_client") or [0]
        fedavg_total = 2 * rounds * sum(params) / len(params)
        total = c["upload_bytes_per_client_total"] + c["download_bytes_per_client_total"]
        lines.append(f"| {p.algorithm} | {rounds} | {c['upload_bytes_per_client_per_round']:,} | "
                     f"{c['download_bytes_per_client_per_round']:,} | {total:,} | {fedavg_total:,.0f} |")
    return "\n".join(lines) + "\n"


def plot_rounds(pairs: list[PairResult], path: Path, title: str, metric: str = "top1") -> None:
    """accuracy_vs_round.png: per algorithm, mean over seeds of the mean personalized accuracy (``metric``) per
    round, with a SEM band over seeds (none for one seed)."""
    import numpy as np

    fig, ax = round_figure()
    for name in dict.fromkeys(p.algorithm for p in pairs):
        done = [p.series(metric) for p in pairs if p.algorithm == name and p.error is None and p.series(metric)]
        if not done:
            continue
        length = min(len(r) for r in done)
        stats = [mean_sem([r[t] for r in done]) for t in range(length)]
        mean = np.array([s["mean"] for s in stats])
        sem = np.array([s["sem"] for s in stats])
        x = np.arange(length)
        ax.plot(x, mean, marker="o", label=name)
        if len(done) > 1:
            ax.fill_between(x, mean - sem, mean + sem, alpha=0.2)
    save_round_figure(fig, ax, path, title, metric=metric)


def write_report(pairs: list[PairResult], out: Path, title: str, metric: str = "top1") -> list[AlgorithmRow]:
    """Write comparison.md, comparison.csv, communication.md and accuracy_vs_round.png into ``out``, every number
    in the headline ``metric`` (``top1`` or ``top5``)."""
    rows = summarize(pairs, metric=metric)
    atomic_write_text(out / "comparison.md", comparison_markdown(rows, title, metric))
    atomic_write_text(out / "comparison.csv", _csv(rows, metric))
    atomic_write_text(out / "communication.md", communication_markdown(pairs))
    plot_rounds(pairs, out / "accuracy_vs_round.png", title, metric)
    return rows

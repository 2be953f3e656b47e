"""The comparison report: accuracy over seeds, the † marks, the accuracy-per-round figure, communication.

Conventions (COSMOS paper, Table 2): a number is the final-round (or best-round) mean personalized accuracy over
clients, averaged over seeds; its ± is the SEM of the per-seed means. A † marks a baseline whose SEM interval
[mean - SEM, mean + SEM] does not overlap COSMOS's; on the COSMOS row it means no baseline overlaps. Because every
algorithm of a seed shares that seed's partition and round-0 models, the report also gives the paired difference
(COSMOS minus the baseline, final round, per seed), mean ± SEM over the seeds both finished: the seed-to-seed spread
of the partition itself cancels in it.
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from cosmos_pl.federated.run_directory import atomic_write_text
from cosmos_pl.report import mean_sem, round_figure, save_round_figure

__all__ = ["PairResult", "AlgorithmRow", "summarize", "overlaps", "write_report", "comparison_markdown",
           "communication_markdown"]

@dataclass
class PairResult:
    """One finished (or failed) (algorithm, seed) run.

    Attributes:
        algorithm, seed: the pair.
        rounds: per-round mean personalized accuracy over clients, index = round (0 = local-only).
        scored_model: which model the numbers come from ("cluster teacher h_pi(i)" or "client model f_i").
        communication: the run's summary["communication"].
        error: why the pair failed (None when it finished).
    """

    algorithm: str
    seed: int
    rounds: list[float] = field(default_factory=list)
    scored_model: str = ""
    communication: dict[str, Any] = field(default_factory=dict)
    error: Optional[str] = None


@dataclass
class AlgorithmRow:
    """One algorithm over its seeds: final and best round, mean ± SEM of the per-seed means."""

    algorithm: str
    scored_model: str
    seeds: list[int]
    final: dict[str, float]
    best: dict[str, float]
    local_only: dict[str, float]
    failed: list[str]
    dagger: bool = False
    paired: Optional[dict[str, float]] = None  # reference minus this row, final round, paired by seed


def overlaps(a: dict[str, float], b: dict[str, float]) -> bool:
    """Whether the intervals [mean - sem, mean + sem] of ``a`` and ``b`` overlap (touching counts as overlap)."""
    return a["mean"] - a["sem"] <= b["mean"] + b["sem"] and b["mean"] - b["sem"] <= a["mean"] + a["sem"]


def summarize(pairs: list[PairResult], reference: str = "cosmos") -> list[AlgorithmRow]:
    """Group pairs by algorithm (in first-seen order) and mark † against ``reference``.

    Per seed, final = the last round's mean personalized accuracy, best = the highest over rounds >= 1; over seeds,
    mean and SEM (sample std / sqrt(S); 0 for one seed). Failed pairs are listed, not averaged.
    """
    order: list[str] = []
    for p in pairs:
        if p.algorithm not in order:
            order.append(p.algorithm)
    rows = []
    for name in order:
        done = [p for p in pairs if p.algorithm == name and p.error is None and len(p.rounds) > 1]
        failed = [f"seed {p.seed}: {p.error}" for p in pairs if p.algorithm == name and p.error is not None]
        nan = {"mean": math.nan, "sem": math.nan}
        rows.append(AlgorithmRow(
            algorithm=name, scored_model=done[0].scored_model if done else "", seeds=[p.seed for p in done],
            final=mean_sem([p.rounds[-1] for p in done]) if done else nan,
            best=mean_sem([max(p.rounds[1:]) for p in done]) if done else nan,
            local_only=mean_sem([p.rounds[0] for p in done]) if done else nan,
            failed=failed))
    ref = next((r for r in rows if r.algorithm == reference and r.seeds), None)
    if ref is not None:
        others = [r for r in rows if r is not ref and r.seeds]
        final_of = {(p.algorithm, p.seed): p.rounds[-1] for p in pairs if p.error is None and len(p.rounds) > 1}
        for r in others:
            r.dagger = not overlaps(ref.final, r.final)
            common = [s for s in r.seeds if s in ref.seeds]
            if common:
                r.paired = mean_sem([final_of[(reference, s)] - final_of[(r.algorithm, s)] for s in common])
        ref.dagger = bool(others) and all(r.dagger for r in others)
    return rows


def _pm(stats: dict[str, float]) -> str:
    return "-" if math.isnan(stats["mean"]) else f"{stats['mean']:.4f} ± {stats['sem']:.4f}"


def comparison_markdown(rows: list[AlgorithmRow], title: str) -> str:
    lines = [f"# {title}", "",
             "Final-round and best-round mean personalized accuracy over clients; mean ± SEM of the per-seed means. "
             "† (baseline rows): the SEM interval does not overlap COSMOS's; † on COSMOS: it overlaps no baseline. "
             "Best round is reported beside final and never used to select anything. "
             "COSMOS - this: the final-round difference paired by seed (same partition and round 0), "
             "mean ± SEM over seeds.", "",
             "| algorithm | scored model | seeds | final round | best round | local-only (round 0) | COSMOS - this |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        name = r.algorithm + (" †" if r.dagger else "")
        seeds = ",".join(map(str, r.seeds)) or "-"
        lines.append(f"| {name} | {r.scored_model or '-'} | {seeds} | {_pm(r.final)} | {_pm(r.best)} | {_pm(r.local_only)} | "
                     f"{_pm(r.paired) if r.paired else '-'} |")
    failures = [(r.algorithm, f) for r in rows for f in r.failed]
    if failures:
        lines += ["", "Failed pairs (not averaged):", ""]
        lines += [f"- {alg}, {f}" for alg, f in failures]
    return "\n".join(lines) + "\n"


def _csv(rows: list[AlgorithmRow]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["algorithm", "scored_model", "seeds", "final_mean", "final_sem", "best_mean", "best_sem",
                "local_only_mean", "local_only_sem", "dagger", "failed_pairs", "paired_diff_mean", "paired_diff_sem"])
    for r in rows:
        w.writerow([r.algorithm, r.scored_model, " ".join(map(str, r.seeds)),
                    *(f"{v:.6f}" if not math.isnan(v) else "" for v in
                      (r.final["mean"], r.final["sem"], r.best["mean"], r.best["sem"], r.local_only["mean"],
                       r.local_only["sem"])),
                    int(r.dagger), len(r.failed),
                    *((f"{r.paired['mean']:.6f}", f"{r.paired['sem']:.6f}") if r.paired else ("", ""))])
    return buf.getvalue()


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


def plot_rounds(pairs: list[PairResult], path: Path, title: str) -> None:
    """accuracy_vs_round.png: per algorithm, mean over seeds of the mean personalized accuracy per round, with a
    SEM band over seeds."""
    import numpy as np

    fig, ax = round_figure()
    for name in dict.fromkeys(p.algorithm for p in pairs):
        done = [p.rounds for p in pairs if p.algorithm == name and p.error is None and p.rounds]
        if not done:
            continue
        length = min(len(r) for r in done)
        stats = [mean_sem([r[t] for r in done]) for t in range(length)]
        mean = np.array([s["mean"] for s in stats])
        sem = np.array([s["sem"] for s in stats])
        x = np.arange(length)
        ax.plot(x, mean, marker="o", label=name)
        ax.fill_between(x, mean - sem, mean + sem, alpha=0.2)
    save_round_figure(fig, ax, path, title)


def write_report(pairs: list[PairResult], out: Path, title: str) -> list[AlgorithmRow]:
    """Write comparison.md, comparison.csv, communication.md and accuracy_vs_round.png into ``out``."""
    rows = summarize(pairs)
    atomic_write_text(out / "comparison.md", comparison_markdown(rows, title))
    atomic_write_text(out / "comparison.csv", _csv(rows))
    atomic_write_text(out / "communication.md", communication_markdown(pairs))
    plot_rounds(pairs, out / "accuracy_vs_round.png", title)
    return rows

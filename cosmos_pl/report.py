"""Summary statistics over clients and the per-round table printed at the end of a run."""

from __future__ import annotations

import math
from typing import Any, Sequence

from rich.console import Console
from rich.table import Table

__all__ = ["mean_sem", "round_table"]


def mean_sem(values: Sequence[float | None]) -> dict[str, float]:
    """``{"mean", "sem", "n"}`` over clients (or seeds); SEM = sample std (ddof=1) / sqrt(n), 0 for n = 1.

    Undefined values (None or NaN, e.g. the accuracy of a client without test samples) are skipped: ``n``
    counts the values averaged. With none defined, mean and SEM are NaN and n is 0.
    """
    vals = [float(v) for v in values if v is not None and not math.isnan(float(v))]
    n = len(vals)
    if not vals:
        return {"mean": math.nan, "sem": math.nan, "n": 0}
    mean = sum(vals) / n
    if n == 1:
        return {"mean": mean, "sem": 0.0, "n": 1}
    var = sum((v - mean) ** 2 for v in vals) / (n - 1)
    return {"mean": mean, "sem": math.sqrt(var / n), "n": n}


def _fmt(mean: Any, sem: Any) -> str:
    if mean is None or (isinstance(mean, float) and math.isnan(mean)):
        return "-"
    return f"{mean:.4f} ± {sem:.4f}"


def round_table(rows: list[dict[str, Any]], title: str = "personalized accuracy per round") -> Table:
    """A rich table of metrics.csv rows: teacher h_pi(i) (when the algorithm has one) and client f_i accuracy,
    mean ± SEM over clients."""
    table = Table(title=title)
    table.add_column("round", justify="right")
    table.add_column("phase")
    has_teacher = any(r.get("teacher_acc_mean") is not None for r in rows)
    has_top5 = any("client_top5_mean" in r for r in rows)
    if has_teacher:
        table.add_column("teacher h_pi(i) top-1", justify="right")
    table.add_column("client f_i top-1", justify="right")
    if has_top5:
        if has_teacher:
            table.add_column("teacher top-5", justify="right")
        table.add_column("client top-5", justify="right")
    table.add_column("K", justify="right")
    table.add_column("up/down bytes per client", justify="right")
    for r in rows:
        cells = [str(r["round"]), r["phase"]]
        if has_teacher:
            cells.append(_fmt(r["teacher_acc_mean"], r["teacher_acc_sem"]))
        cells.append(_fmt(r["client_acc_mean"], r["client_acc_sem"]))
        if has_top5:
            if has_teacher:
                cells.append(_fmt(r.get("teacher_top5_mean"), r.get("teacher_top5_sem")))
            cells.append(_fmt(r.get("client_top5_mean"), r.get("client_top5_sem")))
        cells += [str(r["num_clusters"] or "-"), f"{r['upload_bytes_per_client']:,} / {r['download_bytes_per_client']:,}"]
        table.add_row(*cells)
    return table


def print_table(rows: list[dict[str, Any]], console: Console | None = None,
                title: str = "personalized accuracy per round") -> None:
    (console or Console()).print(round_table(rows, title))

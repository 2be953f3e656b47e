"""Summary statistics over clients, the per-round table printed at the end of a run, and the console a run prints
on (:func:`log_console`)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Sequence

from rich.console import Console
from rich.table import Table

__all__ = ["mean_sem", "round_table", "run_curves", "plot_run", "round_figure", "save_round_figure", "METRIC_LABEL",
           "log_console"]


METRIC_LABEL = {"top1": "top-1", "top5": "top-5"}

#: Columns a console without a terminal lays a table out in: more than any table needs, so none is squeezed.
NO_TERMINAL_WIDTH = 10_000


def log_console(file: Any = None) -> Console:
    """The console a run prints its lines on (``file``: a text stream; None: standard output).

    On a terminal it is rich's own (the terminal's width). Without one (a file, a pipe, a CI or scheduler log)
    rich would lay every line out in 80 columns, splitting paths and padding the broken lines with spaces: there,
    a line is printed whole (``soft_wrap``) and a table gets the width it needs (:data:`NO_TERMINAL_WIDTH`).
    """
    console = Console(file=file)
    if console.is_terminal:
        return console
    return Console(file=file, soft_wrap=True, width=NO_TERMINAL_WIDTH)


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
    (console or log_console()).print(round_table(rows, title))


# (label, metrics.csv column prefix, line style): test solid, validation dashed
_CURVES = [("teacher h_pi(i), test", "teacher_acc", "-"), ("client f_i, test", "client_acc", "-"),
           ("teacher h_pi(i), validation", "teacher_val_acc", "--"), ("client f_i, validation", "client_val_acc", "--")]


def _defined(value: Any) -> bool:
    return value is not None and value != "" and not math.isnan(float(value))


def run_curves(rows: list[dict[str, Any]]) -> dict[str, list[tuple[int, float, float]]]:
    """The per-round curves of one run from its metrics.csv rows: ``{label: [(round, mean, sem), ...]}`` for the
    teacher and client accuracy on the test and validation splits (mean ± SEM over clients). Rounds where a
    curve is undefined (no teacher in round 0, no validation split) are left out; so is a curve with no round."""
    curves: dict[str, list[tuple[int, float, float]]] = {}
    for label, prefix, _ in _CURVES:
        points = [(int(r["round"]), float(r[f"{prefix}_mean"]), float(r[f"{prefix}_sem"]))
                  for r in rows if _defined(r.get(f"{prefix}_mean"))]
        if points:
            curves[label] = points
    return curves


def round_figure():
    """A new (figure, axes) for an accuracy-per-round plot, on matplotlib's file-only Agg backend."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    return plt.subplots(figsize=(7, 4.5))


def save_round_figure(fig: Any, ax: Any, path: Path, title: str, legend_fontsize: Any = None,
                      metric: str = "top1") -> None:
    """Label ``ax`` (integer rounds, mean personalized accuracy in ``metric``: ``top1`` or ``top5``), then write
    ``fig`` to ``path`` atomically and close it."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    from cosmos_pl.files import atomic_save_figure

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("round")
    ax.set_ylabel(f"mean personalized accuracy ({METRIC_LABEL[metric]})")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=legend_fontsize)
    fig.tight_layout()
    try:
        atomic_save_figure(fig, path)
    finally:
        plt.close(fig)


def plot_run(rows: list[dict[str, Any]], path: Path, title: str) -> None:
    """Write ``path`` (accuracy_vs_round.png): :func:`run_curves` as lines with a ± SEM band over clients, the
    local-only level (round 0's client accuracy on test) as a dotted line. Written atomically."""
    import numpy as np

    styles = {label: style for label, _, style in _CURVES}
    fig, ax = round_figure()
    curves = run_curves(rows)
    for label, points in curves.items():
        x, mean, sem = (np.array(v) for v in zip(*points))
        line, = ax.plot(x, mean, styles[label], marker="o", markersize=3, label=label)
        ax.fill_between(x, mean - sem, mean + sem, alpha=0.15, color=line.get_color())
    local = [mean for rnd, mean, _ in curves.get("client f_i, test", []) if rnd == 0]
    if local:
        ax.axhline(local[0], color="grey", linestyle=":", label="local-only (round 0), test")
    save_round_figure(fig, ax, path, title, legend_fontsize=8)

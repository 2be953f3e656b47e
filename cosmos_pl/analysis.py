"""Helpers to explore a run directory written by ``cosmos-pl fit``.

A run directory holds ``metrics.csv`` (one row per round), ``clients.csv`` (one
row per round and client), ``clusters.json``, ``summary.json``, ``config.yaml``
and ``partition.json``.  :func:`find_run` finds the folder to explore (by default
the newest run or comparison under ``runs/``); :func:`load_run` reads it into plain
Python objects; :func:`plot_accuracy` and :func:`plot_clusters` draw the two standard
figures (:func:`figure_skipped` says why one does not apply) and :func:`headline` /
:func:`final_clients_table` give the text summaries used by
``notebooks/explore_run.ipynb``. A comparison folder (``cosmos-pl compare --out``)
is recognized as one: its headline is its status, its runs and its report.

Only the standard library, numpy, matplotlib and yaml are used (no pandas).
The plotting functions use the object-oriented matplotlib API and never call
``plt.show``, so they work under the non-interactive "Agg" backend.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any, Optional

import numpy as np

__all__ = [
    "find_run",
    "load_run",
    "figure_skipped",
    "contingency",
    "plot_accuracy",
    "plot_clusters",
    "headline",
    "final_clients_table",
]

# Columns that hold integers / free text; every other column is parsed as float.
_INT_COLUMNS = {"round", "client", "cluster", "num_clusters", "personalized_acc_clients"}
_TEXT_COLUMNS = {"phase", "backbone"}


def _parse_value(column: str, value: Optional[str]) -> Any:
    """Parse one CSV cell: empty -> None, ints for id columns, floats otherwise."""
    if value is None:
        return None
    value = value.strip()
    if column in _TEXT_COLUMNS:
        return value
    if value == "" or value.lower() in {"nan", "none", "null"}:
        return None
    try:
        if column in _INT_COLUMNS:
            return int(float(value))
        return float(value)
    except ValueError:
        return value


def _read_csv(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    with path.open(newline="") as fh:
        return [{k: _parse_value(k, v) for k, v in row.items()} for row in csv.DictReader(fh)]


def _read_json(path: Path) -> Optional[dict]:
    if not path.is_file():
        return None
    with path.open() as fh:
        return json.load(fh)


def _pairs(path: Path) -> list[Path]:
    """A comparison's pair folders: ``runs/<algorithm>-seed<s>/`` (``<point>/runs/...`` with ``--grid``), each
    holding the ``pair.yaml`` compare writes before the pair runs."""
    return sorted(p.parent for pattern in ("runs/*/pair.yaml", "*/runs/*/pair.yaml") for p in path.glob(pattern))


def _is_comparison(path: Path) -> bool:
    """Whether ``path`` is a ``cosmos-pl compare --out`` folder: its report (comparison.md, or grid.md for a
    ``--grid``), or its pair folders before the report is written."""
    return (path / "comparison.md").is_file() or (path / "grid.md").is_file() or bool(_pairs(path))


def _is_run(path: Path) -> bool:
    return any((path / name).is_file() for name in ("config.yaml", "metrics.csv", "summary.json"))


def find_run(path=None, root="runs") -> Path:
    """The folder to explore: ``path`` when given, else the newest run or comparison directly under ``root``
    (by the time a file was last written in it).

    A relative ``path`` (or ``root``) that does not exist here is also looked for one folder up, so that the
    notebook opened from ``notebooks/`` finds ``runs/...`` of the repository root.

    Raises:
        FileNotFoundError: no ``path`` given and no run or comparison under ``root``; the message says how to make
            one (``make demo`` writes ``runs/fmnist_quickstart-<time>/``) or how to name one.
    """

    def here_or_up(p: Path) -> Path:
        up = Path("..") / p
        return up if not p.is_absolute() and not p.exists() and up.exists() else p

    if path is not None and str(path) != "":
        return here_or_up(Path(path).expanduser())
    folder = here_or_up(Path(root).expanduser())
    found = [p for p in folder.iterdir() if p.is_dir() and (_is_run(p) or _is_comparison(p))] if folder.is_dir() else []
    if not found:
        raise FileNotFoundError(
            f"no run or comparison under {folder.resolve()}: make one (`make demo` writes "
            f"runs/fmnist_quickstart-<time>/), or set COSMOS_RUN_DIR (or RUN_DIR) to a run directory")
    return max(found, key=lambda p: (p.stat().st_mtime, p.name))


def load_run(path) -> dict:
    """Load a run directory, or a comparison folder (``cosmos-pl compare --out``).

    A comparison folder gives ``{"kind": "comparison", "path", "finished", "report", "report_file", "runs"}``:
    whether its report is written (comparison.md, or grid.md for a ``--grid``: compare writes it once every pair
    has ended), that report's text and file name (None before), and its pairs' run directories
    (``runs/<algorithm>-seed<s>``, sorted). A run directory gives ``"kind": "run"`` and the keys

    * ``metrics``: list of per-round dict rows; numeric cells are floats (``round``
      and ``num_clusters`` ints), empty cells (e.g. round-0 teacher columns) are
      ``None``.
    * ``clients``: list of per-(round, client) rows parsed the same way
      (empty list when ``clients.csv`` is missing, as in older runs).
    * ``clusters``: the ``clusters.json`` dict (``None`` if missing).
    * ``summary``: the ``summary.json`` dict (``None`` if missing).
    * ``config``: ``config.yaml`` via ``yaml.safe_load`` (``None`` if missing).
    * ``partition``: ``partition.json`` (``None`` if missing).
    * ``path``: the run directory as a :class:`pathlib.Path`.
    """
    root = Path(path).expanduser()
    if not root.is_dir():
        raise FileNotFoundError(f"run directory not found: {root}")
    if _is_comparison(root) and not _is_run(root):
        report = next((root / name for name in ("comparison.md", "grid.md") if (root / name).is_file()), None)
        return {"kind": "comparison", "path": root, "finished": report is not None,
                "report": None if report is None else report.read_text(),
                "report_file": None if report is None else report.name, "runs": _pairs(root)}
    config = None
    cfg_path = root / "config.yaml"
    if cfg_path.is_file():
        import yaml

        with cfg_path.open() as fh:
            config = yaml.safe_load(fh)
    return {
        "kind": "run",
        "path": root,
        "metrics": _read_csv(root / "metrics.csv"),
        "clients": _read_csv(root / "clients.csv"),
        "clusters": _read_json(root / "clusters.json"),
        "summary": _read_json(root / "summary.json"),
        "config": config,
        "partition": _read_json(root / "partition.json"),
    }


def contingency(assignment, groups) -> np.ndarray:
    """Contingency table of found clusters against true groups.

    ``table[g, k]`` counts the clients of true group ``g`` assigned to cluster
    ``k``.  Ids must be non-negative integers; the shape is
    ``(max(groups) + 1, max(assignment) + 1)``.
    """
    assignment = np.asarray(assignment, dtype=int)
    groups = np.asarray(groups, dtype=int)
    if assignment.shape != groups.shape or assignment.ndim != 1:
        raise ValueError("assignment and groups must be 1-d and of equal length")
    if assignment.size and (assignment.min() < 0 or groups.min() < 0):
        raise ValueError("cluster and group ids must be non-negative")
    n_groups = int(groups.max()) + 1 if groups.size else 0
    n_clusters = int(assignment.max()) + 1 if assignment.size else 0
    table = np.zeros((n_groups, n_clusters), dtype=int)
    np.add.at(table, (groups, assignment), 1)
    return table


def _new_ax(ax):
    if ax is not None:
        return ax
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6, 4))
    try:  # attach a canvas so the figure can be saved / shown inline
        from matplotlib.backends.backend_agg import FigureCanvasAgg

        FigureCanvasAgg(fig)
    except Exception:  # pragma: no cover
        pass
    return fig.add_subplot(1, 1, 1)


def _series(rows, key):
    xs, mean, sem = [], [], []
    for row in rows:
        m = row.get(f"{key}_mean")
        if m is None:
            continue
        xs.append(row["round"])
        mean.append(m)
        s = row.get(f"{key}_sem")
        sem.append(0.0 if s is None else s)
    return np.asarray(xs, float), np.asarray(mean, float), np.asarray(sem, float)


def _local_only_acc(run) -> Optional[float]:
    summary = run.get("summary") or {}
    try:
        return float(summary["local_only"]["client_acc"]["mean"])
    except (KeyError, TypeError):
        pass
    for row in run.get("metrics") or []:
        if row.get("round") == 0 and row.get("client_acc_mean") is not None:
            return float(row["client_acc_mean"])
    return None


def plot_accuracy(run, ax=None):
    """Teacher and client mean personalized accuracy per round with SEM bands.

    The teacher curve starts at round 1 (round 0 is local-only training, with no
    teacher); a dashed horizontal line marks the round-0 local-only client
    accuracy.  Returns the matplotlib Axes.

    Raises:
        ValueError: ``run`` is a comparison (:func:`figure_skipped`'s sentence).
    """
    skipped = figure_skipped(run, "accuracy")
    if skipped is not None:
        raise ValueError(skipped)
    ax = _new_ax(ax)
    rows = sorted(run.get("metrics") or [], key=lambda r: r["round"])
    for key, label, color in (
        ("teacher_acc", "cluster teacher", "C0"),
        ("client_acc", "client", "C1"),
    ):
        x, m, s = _series(rows, key)
        if x.size == 0:
            continue
        ax.plot(x, m, marker="o", color=color, label=f"{label} (mean ± SEM)")
        ax.fill_between(x, m - s, m + s, color=color, alpha=0.25, linewidth=0)
    local = _local_only_acc(run)
    if local is not None:
        ax.axhline(local, color="grey", linestyle="--", label=f"local-only (round 0): {local:.4f}")
    ax.set_xlabel("round")
    ax.set_ylabel("personalized accuracy (top-1)")
    if rows:
        ax.set_xticks(sorted({int(r["round"]) for r in rows}))
    ax.legend(loc="best")
    return ax


def _clusters_info(run) -> dict:
    clusters = run.get("clusters")
    if clusters:
        return clusters
    return dict((run.get("summary") or {}).get("clusters") or {})


def plot_clusters(run, ax=None):
    """Cluster assignment against the true groups.

    Draws the :func:`contingency` table as an annotated heat map (rows = true
    group, columns = found cluster) titled with K and the adjusted Rand index.
    When the run has no true groups (``true_groups`` is null), draws a bar chart
    of the cluster sizes instead.  Returns the matplotlib Axes.

    Raises:
        ValueError: the run has no clusters, or ``run`` is a comparison (the message is
            :func:`figure_skipped`'s sentence).
    """
    skipped = figure_skipped(run, "clusters")
    if skipped is not None:
        raise ValueError(skipped)
    ax = _new_ax(ax)
    info = _clusters_info(run)
    assignment = info.get("assignment") or []
    groups = info.get("true_groups")
    K = info.get("K")
    if K is None and assignment:
        K = len(set(assignment))
    ari = info.get("adjusted_rand_index")
    ari_text = "n/a" if ari is None else f"{ari:.3f}"
    if groups is not None and len(groups) == len(assignment) and assignment:
        table = contingency(assignment, groups)
        im = ax.imshow(table, cmap="Blues", aspect="auto", vmin=0)
        vmax = table.max() if table.size else 0
        for g in range(table.shape[0]):
            for k in range(table.shape[1]):
                ax.text(
                    k, g, str(table[g, k]), ha="center", va="center",
                    color="white" if table[g, k] > vmax / 2 else "black",
                )
        ax.set_xticks(range(table.shape[1]))
        ax.set_yticks(range(table.shape[0]))
        ax.set_xlabel("found cluster")
        ax.set_ylabel("true group")
        ax.figure.colorbar(im, ax=ax, label="clients")
        ax.set_title(f"clusters vs true groups: K = {K}, ARI = {ari_text}")
    else:
        sizes = np.bincount(np.asarray(assignment, dtype=int)) if assignment else np.zeros(0, int)
        ax.bar(np.arange(sizes.size), sizes, color="C0")
        for k, n in enumerate(sizes):
            ax.text(k, n, str(int(n)), ha="center", va="bottom")
        ax.set_xticks(range(sizes.size))
        ax.set_xlabel("found cluster")
        ax.set_ylabel("clients")
        ax.set_title(f"cluster sizes: K = {K} (no true groups)")
    return ax


def figure_skipped(run, figure: str) -> Optional[str]:
    """Why ``figure`` (``"accuracy"``: :func:`plot_accuracy`, ``"clusters"``: :func:`plot_clusters`) does not apply
    to ``run`` (a :func:`load_run` result), in one sentence; None when it does.

    A comparison has its own figure (accuracy_vs_round.png) and its runs one each; a run without clusters
    (LocalOnly, FedAvg, FedMD, ...: K is None) has no cluster chart, nor has a clustering run before its first
    clustering.

    Raises:
        ValueError: an unknown ``figure``.
    """
    if figure not in ("accuracy", "clusters"):
        raise ValueError(f"figure={figure!r}: give 'accuracy' or 'clusters'")
    if run.get("kind") == "comparison":
        return (f"{run['path']} is a comparison: its figures are the .png files in it; set RUN_DIR to one of its "
                "runs for that run's figures")
    if figure == "clusters" and not _clusters_info(run).get("assignment"):
        if run.get("summary") is None:
            return "no clusters recorded yet (no clusters.json): no cluster chart"
        return f"no clusters: {_algorithm(run)} forms none (K = None), so there is no cluster chart"
    return None


def _algorithm(run) -> str:
    return str((run.get("summary") or {}).get("algorithm") or _config_algorithm(run))


def _fmt(x, digits=4) -> str:
    return "n/a" if x is None else f"{float(x):.{digits}f}"


def _final_from_metrics(run) -> dict:
    rows = [r for r in run.get("metrics") or [] if r.get("teacher_acc_mean") is not None]
    if not rows:
        return {}
    last = max(rows, key=lambda r: r["round"])
    return {
        "round": last["round"],
        "teacher_acc": {"mean": last["teacher_acc_mean"], "sem": last.get("teacher_acc_sem")},
        "client_acc": {"mean": last.get("client_acc_mean"), "sem": last.get("client_acc_sem")},
    }


def _config_algorithm(run) -> str:
    """The algorithm's short name from config.yaml (a run without summary.json), e.g. ``cosmos``."""
    config = run.get("config") if isinstance(run.get("config"), dict) else {}
    return str((config.get("algorithm") or {}).get("class_path", "cosmos")).rsplit(".", 1)[-1].lower()


def headline(run) -> str:
    """One-paragraph text summary: final teacher accuracy ± SEM, final client
    accuracy, local-only (round 0) client accuracy, K and the ARI.

    Uses ``summary.json`` when present and falls back to ``metrics.csv``. For a comparison: its status, its runs
    and its report (comparison.md).
    """
    if run.get("kind") == "comparison":
        return _comparison_headline(run)
    summary = run.get("summary") or {}
    final = summary.get("final") or _final_from_metrics(run)
    teacher = final.get("teacher_acc") or {}
    client = final.get("client_acc") or {}
    info = _clusters_info(run)
    ari = info.get("adjusted_rand_index")
    finished = run.get("summary") is not None
    status = "finished" if finished else (
        f"NOT FINISHED (no summary.json): stopped after round {final.get('round', 'n/a')}; resume it with "
        f"`cosmos-pl fit --resume {run.get('path')}`, the figures below are its last complete round")
    lines = [
        f"run: {run.get('path')}",
        f"status: {status}",
        f"algorithm: {summary.get('algorithm', _config_algorithm(run))}; headline model: "
        f"{summary.get('scored_model', 'cluster teacher h_pi(i)')}",
        f"{'final' if finished else 'last complete'} round: {final.get('round', 'n/a')}",
        f"final teacher accuracy: {_fmt(teacher.get('mean'))} ± {_fmt(teacher.get('sem'))} (SEM over clients)",
        f"final client accuracy:  {_fmt(client.get('mean'))} ± {_fmt(client.get('sem'))}",
        f"local-only client accuracy (round 0): {_fmt(_local_only_acc(run))}",
    ]
    covered, total = (final.get("personalized_acc") or {}).get("clients"), summary.get("num_clients")
    if covered is not None and total is not None and covered < total:  # clients without test samples
        lines.append(f"means over the {covered} of {total} clients with test samples (the others: undefined)")
    top5 = [r for r in run.get("metrics") or [] if r.get("teacher_top5_mean") is not None]
    if top5:  # only written for data sets with >= 20 classes
        last = max(top5, key=lambda r: r["round"])
        lines.append(
            f"final teacher top-5 accuracy: {_fmt(last['teacher_top5_mean'])} ± {_fmt(last.get('teacher_top5_sem'))}"
        )
    if info.get("assignment"):
        lines.append(f"clusters: K = {info.get('K', 'n/a')}, ARI = {_fmt(ari, 3)}")
    else:
        lines.append(f"clusters: none ({_algorithm(run)} forms none)" if finished else "clusters: none recorded yet")
    return "\n".join(lines)


def _comparison_headline(run) -> str:
    path, pairs = run["path"], run["runs"]
    status = (f"finished (its report: {run['report_file']})" if run["finished"] else
              "not finished (no comparison.md yet): still running, or stopped; run the same `cosmos-pl compare` "
              "command again to resume it (finished pairs are kept)")
    lines = [f"comparison: {path}", f"status: {status}",
             f"its runs ({len(pairs)}): {', '.join(str(p.relative_to(path)) for p in pairs) or 'none yet'}"]
    if pairs:
        lines.append(f"to explore one, set RUN_DIR to it, e.g. {pairs[0]}")
    if run["report"]:
        lines += ["", run["report"].rstrip()]
    return "\n".join(lines)


def final_clients_table(run) -> str:
    """Plain-text table of the per-client rows of the last round in ``clients.csv``."""
    if run.get("kind") == "comparison":
        return f"(a comparison: each of its runs has its own clients.csv, under {run['path'] / 'runs'})"
    rows = run.get("clients") or []
    if not rows:
        return "(no clients.csv in this run directory)"
    last = max(r["round"] for r in rows)
    rows = sorted((r for r in rows if r["round"] == last), key=lambda r: r["client"])
    groups = (_clusters_info(run) or {}).get("true_groups")
    cols = [c for c in rows[0].keys() if c != "round"]
    header = ["client"] + [c for c in cols if c != "client"]
    if groups is not None:
        header.insert(header.index("cluster") + 1 if "cluster" in header else 1, "true_group")

    def cell(row, col):
        if col == "true_group":
            i = row["client"]
            return str(groups[i]) if 0 <= i < len(groups) else ""
        v = row.get(col)
        if v is None:
            return "-"
        return f"{v:.4f}" if isinstance(v, float) else str(v)

    table = [[cell(r, c) for c in header] for r in rows]
    widths = [max(len(h), *(len(t[i]) for t in table)) for i, h in enumerate(header)]
    out = [f"round {last}", "  ".join(h.rjust(w) for h, w in zip(header, widths))]
    out += ["  ".join(v.rjust(w) for v, w in zip(t, widths)) for t in table]
    return "\n".join(out)

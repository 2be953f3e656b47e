"""``cosmos-pl compare --grid KEY=V1,V2,...``: the comparison at every point of a settings grid.

Each ``--grid`` sweeps one setting; several make their product. A key is any ``fit`` setting
(``data.partitioner.init_args.alpha``, ``data.num_clients``, ``data.public_fraction``, ...) or an algorithm's init
setting, as ``algorithm.init_args.NAME`` or the bare name (``b0``, ``temperature``, ``aggregation``, ``lambda_``,
``teacher_backbone``). An algorithm setting goes to every compared algorithm that takes it (COSMOS and COMET both
take ``lambda_``); an algorithm that does not is run once, not per value, and the tables say so.

Each point gets its folder ``OUT/<name>=<value>[,...]/`` with the usual report (comparison.md with the paired
differences, comparison.csv, communication.md, accuracy_vs_round.png; its runs under ``runs/``); a pair identical
at several points (an algorithm the sweep does not touch) runs once, in the first point's folder, and the others
read it. One round-0 cache ``OUT/round0`` serves every point (it is keyed by the settings that decide round 0).
Then ``OUT/grid.md`` (a table of every point's validation accuracy, what settings are chosen on, or, where the
runs held out no validation split, one line saying to set ``data.validation_fraction``; then every point's table)
and one figure per swept setting, ``OUT/grid_<name>.png``: the final round's mean personalized accuracy (mean ± SEM
over seeds) against the setting's values, one line per algorithm (per value of the other settings, when several
are swept). Skip, resume and failure rules are those of compare.
"""

from __future__ import annotations

import difflib
import inspect
import itertools
import re
from pathlib import Path
from typing import Any, Optional

import yaml
from jsonargparse import Namespace
from rich.console import Console

from cosmos_pl.algorithms import algorithm_class
from cosmos_pl.compare.plan import ComparePlan, Pair
from cosmos_pl.compare.report import AlgorithmRow, comparison_markdown, plus_minus
from cosmos_pl.errors import ConfigError
from cosmos_pl.files import atomic_write_text

__all__ = ["parse_grid", "grid_points", "point_name", "algorithm_setting", "takes", "check_keys", "settings_for",
           "read_everywhere", "grid_counts", "print_grid_plan", "point_notes", "grid_lines",
           "grid_markdown", "NO_VALIDATION", "validation_markdown", "clustering_markdown", "plot_grid",
           "write_grid_report"]

ALGORITHM_PREFIXES = ("algorithm.init_args.", "algorithm.")


def _values(text: str) -> list[str]:
    """``V1,V2,...`` split at the commas outside brackets (a list value such as ``[a, b]`` stays whole)."""
    out, depth, current = [], 0, ""
    for ch in text:
        if ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(current.strip())
            current = ""
        else:
            current += ch
    out.append(current.strip())
    return [v for v in out if v]


def parse_grid(items: list[str]) -> list[tuple[str, list[Any]]]:
    """``["KEY=V1,V2", ...]`` as ``[(KEY, [V1, V2]), ...]``, each value read as YAML (``5`` an int, ``0.1`` a
    float, ``auto`` a string).

    Raises:
        ConfigError: an item without ``=``, without values, or a key given twice."""
    grid: list[tuple[str, list[Any]]] = []
    for item in items:
        key, sep, rest = str(item).partition("=")
        key = key.strip()
        values = _values(rest) if sep else []
        if not key or not values:
            raise ConfigError(f"--grid {item!r}: give KEY=V1,V2,... (e.g. --grid data.partitioner.init_args.alpha="
                              "1,5,100)")
        if key in [k for k, _ in grid]:
            raise ConfigError(f"--grid {key}: given twice; give its values once, comma-separated")
        if key == "seed":
            raise ConfigError("--grid seed: the seeds are compare's own axis; give --seeds 0,1,2")
        grid.append((key, [_value(v) for v in values]))
    return grid


_NUMBER = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")


def _value(text: str) -> Any:
    """A grid value read as YAML; a number YAML 1.1 leaves a string (``1e-1``) is a float."""
    value = yaml.safe_load(text)
    return float(text) if isinstance(value, str) and _NUMBER.match(text) else value


def algorithm_setting(key: str, cfg: Optional[Namespace] = None) -> Optional[str]:
    """The algorithm init setting a grid key names (``algorithm.init_args.b0`` and ``b0`` name ``b0``), else None
    (a key of the whole config: dotted, or a top-level setting of ``cfg`` such as ``rounds``)."""
    for prefix in ALGORITHM_PREFIXES:
        if key.startswith(prefix):
            return key[len(prefix):]
    return None if "." in key or (cfg is not None and key in cfg) else key


def grid_points(grid: list[tuple[str, list[Any]]]) -> list[dict[str, Any]]:
    """Every combination of the swept values, the first key varying slowest."""
    keys = [k for k, _ in grid]
    return [dict(zip(keys, combo)) for combo in itertools.product(*(v for _, v in grid))]


def _short(key: str) -> str:
    return key.rsplit(".", 1)[-1]


def point_name(point: dict[str, Any]) -> str:
    """A point's folder name, ``alpha=5,lambda_=1`` (the last part of each key)."""
    return ",".join(f"{_short(k)}={v}" for k, v in point.items()).replace("/", "_").replace(" ", "")


def takes(cls: type, setting: str) -> bool:
    """Whether algorithm class ``cls`` has the init setting ``setting``."""
    return setting in inspect.signature(cls.__init__).parameters


def settings_for(algorithms: list[str], settings: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per name of ``algorithms``, the algorithm init ``settings`` (a point's) that its class takes."""
    return {name: {k: v for k, v in settings.items() if takes(algorithm_class(name), k)} for name in algorithms}


def _settings_of(cls: type) -> list[str]:
    """The init settings of algorithm class ``cls``, by name."""
    return [name for name, p in inspect.signature(cls.__init__).parameters.items()
            if name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


def _did_you_mean(name: str, choices: list[str], prefix: str = "") -> str:
    """``"; did you mean 'X'?"`` for the closest of ``choices`` to ``name`` (``difflib``, as a misspelt
    ``--algorithm.X`` is answered), ``prefix`` put before it; empty when none is close."""
    close = difflib.get_close_matches(name, choices, n=1)
    return f"; did you mean {prefix + close[0]!r}?" if close else ""


def check_keys(grid: list[tuple[str, list[Any]]], cfg: Namespace, algorithms: list[str]) -> dict[str, list[str]]:
    """Check every key against the config and the algorithms; returns, per algorithm setting, the algorithms that
    do not take it.

    Raises:
        ConfigError: a config key that does not exist, or an algorithm setting none of the algorithms takes; each
            with the closest valid key where one is close (``lamda_``: did you mean 'lambda_'?)."""
    skipped: dict[str, list[str]] = {}
    classes = {name: algorithm_class(name) for name in algorithms}
    for key, _ in grid:
        setting = algorithm_setting(key, cfg)
        if setting is None:
            if key not in cfg:
                raise ConfigError(f"--grid {key}: no such setting{_did_you_mean(key, list(cfg.keys()))} (see "
                                  "cosmos-pl fit --print_config); an algorithm's setting is algorithm.init_args.NAME "
                                  "or its bare name, e.g. --grid b0=0.5,1")
            continue
        if not any(takes(cls, setting) for cls in classes.values()):
            names = list(dict.fromkeys(n for cls in classes.values() for n in _settings_of(cls)))
            hint = _did_you_mean(setting, names, key[:len(key) - len(setting)])
            if not hint and key == setting:  # a bare name may be a misspelt top-level setting (round: rounds)
                hint = _did_you_mean(key, [k for k in cfg.keys() if "." not in k])
            raise ConfigError(f"--grid {key}: none of the algorithms ({', '.join(algorithms)}) takes {setting!r}"
                              f"{hint}")
        skipped[setting] = [name for name, cls in classes.items() if not takes(cls, setting)]
    return skipped


def read_everywhere(plan: ComparePlan) -> frozenset[str]:
    """The algorithms whose pairs are the same runs at every point of ``plan`` (the sweep does not touch them);
    none with fewer than 2 points."""
    if len(plan.points) < 2:
        return frozenset()
    per_point = [{p.algorithm: frozenset(id(q) for q in point.pairs if q.algorithm == p.algorithm)
                  for p in point.pairs} for point in plan.points]
    names = set().union(*per_point)
    return frozenset(n for n in names if len({runs.get(n) for runs in per_point}) == 1)


def grid_counts(plan: ComparePlan, todo: list[Pair], verb: str = "to run") -> str:
    """What a grid compare (or its dry run, ``verb`` "would run") is about to do, in one line; ``todo``: the
    distinct pairs not finished yet."""
    return (f"{len(plan.points)} points x {len(plan.algorithms)} algorithms x {len(plan.seeds)} seeds: "
            f"{len(plan.unique)} distinct pairs, {len(plan.unique) - len(todo)} already finished in {plan.out}, "
            f"{len(todo)} {verb}, {plan.jobs} at a time")


def print_grid_plan(plan: ComparePlan, todo: list[Pair], console: Console) -> None:
    """``--dry_run``: the counts, then a line per point naming the pairs of ``todo`` (the distinct pairs not
    finished yet) that would run in its folder (a pair shared with an earlier point runs there) and, per swept
    setting, the algorithms that do not take it (one run serves every value); runs nothing and writes nothing under
    ``plan.out``."""
    console.print(f"dry run, --grid: {grid_counts(plan, todo, 'would run')}")
    owner: dict[int, Path] = {}
    for point in plan.points:
        for p in point.pairs:
            owner.setdefault(id(p), point.folder)
    waiting = {id(p) for p in todo}
    for point in plan.points:
        here = [p.label for p in point.pairs if owner[id(p)] == point.folder and id(p) in waiting]
        console.print(f"  {point_name(point.values)}: {len(here)} to run" + (f" ({', '.join(here)})" if here else ""))
    for setting, names in plan.skipped.items():
        if names:
            console.print(f"  {setting} is not swept for {', '.join(names)}: one run serves every value of "
                          f"{setting} (a run per value of any other swept setting)")


def point_notes(point: dict[str, Any], skipped: dict[str, list[str]]) -> list[str]:
    """The notes under a point's table: each algorithm that takes no swept setting of ``point`` is the same run at
    every value of it (``skipped``: setting -> the algorithms that do not take it)."""
    notes = []
    for key in point:
        setting = algorithm_setting(key)
        for name in skipped.get(setting or "", []):
            notes.append(f"{name} takes no {setting!r}: the same run at every {_short(key)} (not swept)")
    return notes


def validation_markdown(tables: list[tuple[dict[str, Any], list[AlgorithmRow], list[str]]],
                        read_everywhere: frozenset[str] = frozenset()) -> str:
    """The choosing table: a row per point, a column per algorithm, each cell the final round's validation top-1
    accuracy (mean ± SEM over seeds); in each column the highest mean is bold (every point that ties for it), unless
    the algorithm is in ``read_everywhere`` (its runs are the same at every point: the sweep does not touch it).
    Empty when no run recorded a validation split."""
    import math

    algorithms = list(dict.fromkeys(r.algorithm for _, rows, _ in tables for r in rows))
    cells = {(j, r.algorithm): r.val_final for j, (_, rows, _) in enumerate(tables) for r in rows
             if r.val_final is not None and not math.isnan(r.val_final["mean"])}
    if not cells:
        return ""
    best = {}
    for name in algorithms:
        means = [cells[(j, name)]["mean"] for j in range(len(tables)) if (j, name) in cells]
        if means and name not in read_everywhere:
            best[name] = max(means)
    lines = ["## Validation accuracy at each point", "",
             "The final round's top-1 accuracy on the clients' validation splits (mean over clients; mean ± SEM over "
             "seeds): what a setting is chosen on, never the test accuracy of the tables below. The highest of each "
             "algorithm is bold (none where the column is one run read at every point). Where a swept key is a data "
             "axis (alpha, the number of clients) the bold is no choice, only the best point.", "",
             "| point | " + " | ".join(algorithms) + " |", "| --- |" + " --- |" * len(algorithms)]
    for j, (point, _, _) in enumerate(tables):
        row = []
        for name in algorithms:
            stats = cells.get((j, name))
            text = plus_minus(stats)
            row.append(f"**{text}**" if stats is not None and best.get(name) == stats["mean"] else text)
        lines.append(f"| {point_name(point)} | " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def clustering_markdown(tables: list[tuple[dict[str, Any], list[AlgorithmRow], list[str]]]) -> str:
    """How every clustering algorithm clustered at each point: a row per point, a column per algorithm that
    clusters, each cell K per seed and its mean (* weak structure) and, in a simulation, the adjusted Rand index
    (:meth:`cosmos_pl.compare.report.Clustering.cell`), with "fell back" where a seed kept no cluster (K = N).
    Empty when no algorithm clustered. Read beside the accuracy: along the number of clients, a COSMOS row that
    drops to local-only because its rule kept no cluster says so here."""
    algorithms = list(dict.fromkeys(r.algorithm for _, rows, _ in tables for r in rows if r.clustering))
    if not algorithms:
        return ""
    lines = ["## Clusters at each point", "",
             "K per seed and its mean (* weak structure), and the adjusted Rand index against the true groups; "
             "\"fell back: seeds ...\" where no two clients shared a cluster (K = N), every client distilling a "
             "teacher of its own.", "",
             "| point | " + " | ".join(algorithms) + " |", "| --- |" + " --- |" * len(algorithms)]
    for point, rows, _ in tables:
        by_name = {r.algorithm: r.clustering for r in rows if r.clustering}
        cells = []
        for name in algorithms:
            c = by_name.get(name)
            text = "-" if c is None else c.cell()
            if c is not None and c.alone_seeds:
                text += f"; fell back: seed{'s' if len(c.alone_seeds) > 1 else ''} {', '.join(map(str, c.alone_seeds))}"
            cells.append(text)
        lines.append(f"| {point_name(point)} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


#: grid.md's line where no run held out a validation split: there is nothing to choose a setting on.
NO_VALIDATION = ("No validation table: these runs held out no validation split (data.validation_fraction 0); to "
                 "choose a setting on validation accuracy, never on the test accuracy below, run the grid into a new "
                 "--out with --data.validation_fraction 0.1 (or another fraction > 0).\n")


def grid_markdown(tables: list[tuple[dict[str, Any], list[AlgorithmRow], list[str]]], title: str,
                  metric: str, read_everywhere: frozenset[str] = frozenset()) -> str:
    """The validation table (:func:`validation_markdown`; where no finished run recorded a validation split, the
    line :data:`NO_VALIDATION` saying how to get one), the clusters at each point (:func:`clustering_markdown`),
    then every point's comparison table (as in comparison.md), under a heading naming the point, with its notes."""
    parts = [f"# {title}: grid of {len(tables)} points\n"]
    validation = validation_markdown(tables, read_everywhere)
    if not validation and any(r.seeds for _, rows, _ in tables for r in rows):  # runs finished, none with one
        validation = NO_VALIDATION
    for summary in (validation, clustering_markdown(tables)):
        if summary:
            parts.append(summary)
    for point, rows, notes in tables:
        heading = ", ".join(f"{k} = {v}" for k, v in point.items())
        body = comparison_markdown(rows, heading, metric)
        parts.append(body + "".join(f"\n- {n}" for n in notes) + "\n")
    return "\n".join(parts)


def grid_lines(tables: list[tuple[dict[str, Any], list[AlgorithmRow], list[str]]], key: str, values: list[Any],
               skipped: Optional[dict[str, list[str]]] = None) -> dict[str, list[tuple[float, float, float]]]:
    """The lines of ``grid_<key>.png``: ``{label: [(x, final mean, final SEM), ...]}`` sorted by x, a line per
    algorithm and per value of the other swept settings it takes (``skipped``: setting -> the algorithms that do
    not take it; such an algorithm, run once for every value, gets one line, not one per value)."""
    import math

    numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
    x_of = {repr(v): (float(v) if numeric else j) for j, v in enumerate(values)}
    skipped = skipped or {}
    lines: dict[str, list[tuple[float, float, float]]] = {}
    for point, rows, _ in tables:
        for row in rows:
            if not row.seeds or math.isnan(row.final["mean"]):
                continue
            others = ", ".join(f"{_short(k)}={v}" for k, v in point.items()
                               if k != key and row.algorithm not in skipped.get(algorithm_setting(k) or "", []))
            label = row.algorithm + (f" ({others})" if others else "")
            x = x_of[repr(point[key])]
            pts = lines.setdefault(label, [])
            if all(p[0] != x for p in pts):  # the same run seen at another value of a setting it does not take
                pts.append((x, row.final["mean"], row.final["sem"]))
    return {label: sorted(pts) for label, pts in lines.items()}


def plot_grid(tables: list[tuple[dict[str, Any], list[AlgorithmRow], list[str]]], key: str, values: list[Any],
              path: Path, title: str, metric: str, skipped: Optional[dict[str, list[str]]] = None) -> None:
    """``grid_<name>.png``: final mean personalized accuracy (mean ± SEM over seeds) against ``key``'s values, the
    lines of :func:`grid_lines`; numeric values on a numeric axis (log when they span a factor of 20 or more),
    others evenly spaced."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
    lines = grid_lines(tables, key, values, skipped)
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for label, pts in lines.items():
        ax.errorbar([p[0] for p in pts], [p[1] for p in pts], yerr=[p[2] for p in pts], marker="o", capsize=3,
                    label=label)
    if numeric and min(values) > 0 and max(values) / min(values) >= 20:
        ax.set_xscale("log")
    if not numeric:
        ax.set_xticks(range(len(values)), [str(v) for v in values])
    ax.set_xlabel(key)
    ax.set_ylabel(f"final mean personalized {'top-5 ' if metric == 'top5' else ''}accuracy")
    ax.set_title(f"{title}: final accuracy vs {_short(key)} (mean ± SEM over seeds)", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    tmp = path.with_name(path.stem + ".tmp.png")
    fig.savefig(tmp, dpi=120)
    plt.close(fig)
    tmp.replace(path)


def write_grid_report(plan: ComparePlan, tables: list[tuple[dict[str, Any], list[AlgorithmRow], list[str]]],
                      console: Console) -> None:
    """Write ``plan.out/grid.md`` (:func:`grid_markdown`) and one figure per swept setting,
    ``plan.out/grid_<name>.png`` (:func:`plot_grid`), from every point's table, and say where they are."""
    out, title, metric = plan.out, plan.title, plan.headline_metric
    atomic_write_text(out / "grid.md", grid_markdown(tables, title, metric, read_everywhere(plan)))
    for key, values in plan.grid:
        plot_grid(tables, key, values, out / f"grid_{_short(key)}.png", title, metric, plan.skipped)
    console.print(f"grid report: {out / 'grid.md'}, " +
                  ", ".join(str(out / f"grid_{_short(k)}.png") for k, _ in plan.grid))

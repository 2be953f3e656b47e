"""What a run records: metrics.csv and clients.csv rewritten after every round, summary.json at the end.

Each file is written atomically (temporary file, fsync, rename), so a reader never sees half a file and a
killed run keeps every finished round.
"""

from __future__ import annotations

import csv
import io
from typing import Any, Optional

from cosmos_pl.runs.run_directory import RunDirectory

__all__ = ["Recorder", "format_csv"]


def _cell(value: Any) -> Any:
    return "" if value is None else (f"{value:.6f}" if isinstance(value, float) else value)


def format_csv(rows: list[dict[str, Any]]) -> str:
    """Rows as CSV text: columns from the first row's keys then any new ones, floats with 6 decimals,
    None as an empty cell."""
    columns: list[str] = []
    for r in rows:
        columns += [k for k in r if k not in columns]
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    for r in rows:
        writer.writerow({k: _cell(r.get(k)) for k in columns})
    return buf.getvalue()


class Recorder:
    """Keeps the per-round rows and writes them; with ``run_dir=None`` (benchmarks) it only keeps them.

    Args:
        run_dir: where the files go, or None.
        tracker: the W&B run (``log_round`` / ``summary``), or None.
    """

    def __init__(self, run_dir: Optional[RunDirectory] = None, tracker: Any = None) -> None:
        self.run_dir, self.tracker = run_dir, tracker
        self.rows: list[dict[str, Any]] = []
        self.client_rows: list[dict[str, Any]] = []

    def add_round(self, row: dict[str, Any], client_rows: list[dict[str, Any]]) -> None:
        """Append one round's row and its per-client rows; rewrite metrics.csv and clients.csv whole."""
        self.rows.append(row)
        self.client_rows.extend(client_rows)
        if self.run_dir is not None:
            self.run_dir.write_text("metrics.csv", format_csv(self.rows))
            self.run_dir.write_text("clients.csv", format_csv(self.client_rows))
        if self.tracker is not None:
            self.tracker.log_round(row)

    def write_json(self, name: str, data: Any) -> None:
        if self.run_dir is not None:
            self.run_dir.write_json(name, data)

    def write_summary(self, summary: dict[str, Any]) -> None:
        self.write_json("summary.json", summary)
        if self.tracker is not None:
            self.tracker.summary(summary)

    def state_dict(self) -> dict[str, Any]:
        return {"rows": self.rows, "client_rows": self.client_rows}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rows, self.client_rows = list(state["rows"]), list(state["client_rows"])

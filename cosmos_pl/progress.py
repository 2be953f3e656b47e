"""Progress of a stage or of a comparison's pairs: rich's bars on a terminal, plain lines everywhere else.

Without a terminal (output sent to a file, a CI log or a scheduler's log) rich cannot redraw a bar in place, and
a transient bar leaves an empty line behind; a long run would show nothing between rounds. There, progress is one
plain line when the work ends and, while it runs, one line at most every :data:`LINE_EVERY_S` seconds (the
``COSMOS_PL_PROGRESS_S`` environment variable overrides it), each saying what is done out of what.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any, Optional

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from cosmos_pl.errors import ConfigError

__all__ = ["LINE_EVERY_S", "line_every_s", "round_of", "StageProgress", "Ticker"]

#: Seconds between two progress lines of the same piece of work when there is no terminal.
LINE_EVERY_S = 30.0


def line_every_s() -> float:
    """Seconds between progress lines without a terminal: ``COSMOS_PL_PROGRESS_S`` or :data:`LINE_EVERY_S`.

    Raises:
        ConfigError: ``COSMOS_PL_PROGRESS_S`` is not a number > 0.
    """
    text = os.environ.get("COSMOS_PL_PROGRESS_S")
    if text is None:
        return LINE_EVERY_S
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise ConfigError(f"COSMOS_PL_PROGRESS_S={text!r}: give seconds between progress lines, a number > 0 "
                          f"(default {LINE_EVERY_S:g})")
    return value


def round_of(recorded: int, rounds: int) -> str:
    """A run's round as the run counts them, ``round r/R``: round 0 trains the clients locally, then rounds 1 to
    ``rounds`` (R). ``recorded``: the rounds its ``metrics.csv`` holds (one row per round, round 0's first); the
    round shown is the one in progress, the first not recorded, and R once every round is (``round 0/2`` until
    round 0 ends, ``round 2/2`` while round 2 runs and after it).

    Raises:
        ValueError: ``recorded`` or ``rounds`` below 0.
    """
    if recorded < 0 or rounds < 0:
        raise ValueError(f"recorded={recorded}, rounds={rounds}: neither may be below 0")
    return f"round {min(recorded, rounds)}/{rounds}"


class StageProgress:
    """``with StageProgress(console, "round 1: local fit", total=10, unit="clients") as p: p.advance()``.

    On a terminal (``console.is_terminal``) a transient rich bar; otherwise (a log file, a batch job's output, where a
    bar's redraws would pile up) plain lines: at most one every :func:`line_every_s` seconds while the work runs
    (``round 1: local fit: 4/10 clients, 31 s``) and one when it ends (``round 1: local fit: 10/10 clients in 52 s``).
    Never an empty line.
    """

    def __init__(self, console: Console, description: str, total: int, unit: str = "tasks",
                 transient: bool = True) -> None:
        self.console, self.description, self.total, self.unit = console, description, total, unit
        self.transient = transient
        self.completed = 0
        self._bar: Optional[Progress] = None
        self._task: Any = None
        self._start = self._last = 0.0
        self._every = line_every_s()

    def __enter__(self) -> "StageProgress":
        self._start = self._last = time.perf_counter()
        if self.console.is_terminal:
            self._bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), console=self.console, transient=self.transient)
            self._bar.__enter__()
            self._task = self._bar.add_task(self.description, total=self.total)
        return self

    def advance(self, n: int = 1) -> None:
        """``n`` more units done; without a terminal, a line when :func:`line_every_s` seconds passed since the
        last one (and the work is not finished: the end has its own line)."""
        self.completed += n
        if self._bar is not None:
            self._bar.advance(self._task, n)
            return
        now = time.perf_counter()
        if now - self._last >= self._every and self.completed < self.total:
            self._last = now
            self.console.print(f"{self.description}: {self.completed}/{self.total} {self.unit}, "
                               f"{now - self._start:.0f} s", markup=False, highlight=False)

    def __exit__(self, *exc: Any) -> None:
        if self._bar is not None:
            self._bar.__exit__(*exc)
        elif exc[0] is None:
            self.console.print(f"{self.description}: {self.completed}/{self.total} {self.unit} in "
                               f"{time.perf_counter() - self._start:.0f} s", markup=False, highlight=False)


class Ticker:
    """Calls ``tick()`` every ``seconds`` on a daemon thread until the ``with`` block ends (a comparison's pairs
    report their rounds this way while they run in other processes)."""

    def __init__(self, seconds: float, tick: Any) -> None:
        self.seconds, self.tick = seconds, tick
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.seconds):
            self.tick()

    def __enter__(self) -> "Ticker":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()

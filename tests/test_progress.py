"""Progress without a terminal: plain lines at most every N seconds and one at the end, never an empty line."""

import io

import pytest
from rich.console import Console

from cosmos_pl import progress
from cosmos_pl.errors import ConfigError
from cosmos_pl.progress import StageProgress


def _console() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, force_terminal=False, width=120), out


def test_lines_every_n_seconds_and_at_the_end(monkeypatch):
    """Five tasks ending at 10, 20, 40, 50 and 55 s with a line every 30 s: one line at 40 s (the first advance
    30 s after the start), none at 55 s (the work is finished: the end has its own line), the end at 60 s."""
    clock = iter([0.0, 10.0, 20.0, 40.0, 50.0, 55.0, 60.0])
    monkeypatch.setattr(progress.time, "perf_counter", lambda: next(clock))
    monkeypatch.setenv("COSMOS_PL_PROGRESS_S", "30")
    console, out = _console()
    with StageProgress(console, "round 1: local fit", total=5) as p:
        for _ in range(5):
            p.advance()
    assert out.getvalue().splitlines() == ["round 1: local fit: 3/5 tasks, 40 s", "round 1: local fit: 5/5 tasks in 60 s"]


def test_a_bad_interval_names_the_variable(monkeypatch):
    monkeypatch.setenv("COSMOS_PL_PROGRESS_S", "0")
    with pytest.raises(ConfigError, match="COSMOS_PL_PROGRESS_S='0'"):
        progress.line_every_s()


def test_on_a_terminal_a_bar_and_no_plain_lines():
    console = Console(file=io.StringIO(), force_terminal=True, width=80)
    with StageProgress(console, "round 1: local fit", total=2) as p:
        p.advance(2)
    assert p.completed == 2 and "tasks in" not in console.file.getvalue()

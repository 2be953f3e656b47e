"""Progress without a terminal: plain lines at most every N seconds and one at the end, never an empty line."""

import io
import time

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


def test_a_pairs_round_is_counted_as_the_run_counts_it():
    """rounds: 2 is round 0 (local training) then rounds 1 and 2, one metrics.csv row each: with 0 rows recorded the
    pair is in round 0, with 1 in round 1, with 2 in round 2, and with all 3 it has ended at round 2; never 3/3."""
    assert [progress.round_of(rows, 2) for rows in range(4)] == ["round 0/2", "round 1/2", "round 2/2", "round 2/2"]
    assert progress.round_of(1, 1) == "round 1/1" and progress.round_of(0, 0) == "round 0/0"  # round 0 only
    with pytest.raises(ValueError, match="recorded=-1"):
        progress.round_of(-1, 2)


def test_compares_running_line_shows_the_round_in_progress_out_of_the_runs_rounds(monkeypatch, tmp_path):
    """A pair of rounds: 2 that has recorded rounds 0 and 1 (two metrics.csv rows) is in round 2: "round 2/2"."""
    from cosmos_pl.compare import pairs as compare_pairs

    pair = compare_pairs.Pair("cosmos", 0, tmp_path / "cosmos-seed0", "seed: 0\nrounds: 2\n")

    def launch(p, gpus=None):
        p.run_dir.mkdir(parents=True)
        (p.run_dir / "metrics.csv").write_text("round,personalized_acc_mean\n0,0.5\n1,0.6\n")
        time.sleep(1.0)  # long enough for several progress lines
        return "stopped here"

    monkeypatch.setattr(compare_pairs, "launch", launch)
    monkeypatch.setenv("COSMOS_PL_PROGRESS_S", "0.1")
    console, out = _console()
    assert compare_pairs.execute_pairs([pair], 1, console) == {pair.key: "stopped here"}
    lines = out.getvalue().splitlines()
    assert "running: cosmos seed 0 round 2/2" in lines and not any("3/3" in line for line in lines)

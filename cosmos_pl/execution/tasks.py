"""Running one stage's independent tasks on the executor: with its progress (a bar on a terminal, plain lines
elsewhere: :class:`~cosmos_pl.progress.StageProgress`), timed per stage and round."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Optional

from rich.console import Console

from cosmos_pl.execution.executor import Executor
from cosmos_pl.objectives.step import Task
from cosmos_pl.progress import StageProgress

__all__ = ["StageTimer", "TaskRunner"]


@dataclass
class StageTimer:
    """Seconds per stage, in total and per round."""

    seconds: dict[str, float] = field(default_factory=dict)
    by_round: dict[str, dict[str, float]] = field(default_factory=dict)

    def add(self, rnd: int, stage: str, elapsed: float) -> None:
        self.seconds[stage] = self.seconds.get(stage, 0.0) + elapsed
        per = self.by_round.setdefault(str(rnd), {})
        per[stage] = per.get(stage, 0.0) + elapsed


class TaskRunner:
    """``run(round, stage, tasks, costs, trains, tolerate) -> [(model, output)]`` in task order, on ``executor``.

    With ``tolerate`` (client tasks) a failed task's output is a
    :class:`~cosmos_pl.execution.task_failure.TaskFailure` and ``timeout_s`` applies; otherwise a failure raises
    (server tasks: a teacher that fails stops the run).
    """

    def __init__(self, executor: Executor, console: Console, timeout_s: Optional[float]) -> None:
        self.executor, self.console, self.timeout_s = executor, console, timeout_s
        self.timer = StageTimer()

    def __call__(self, rnd: int, stage: str, tasks: list[Task], costs: Optional[list[float]] = None, *,
                 trains: bool = False, tolerate: bool = False) -> list[tuple[Any, Any]]:
        start = time.perf_counter()
        results: list[Any] = [None] * len(tasks)
        with StageProgress(self.console, f"round {rnd}: {stage}", len(tasks)) as progress:
            for i, model, out in self.executor.map(tasks, costs, returns_model=trains, tolerate=tolerate,
                                                   timeout_s=self.timeout_s if tolerate else None):
                results[i] = (model, out)
                progress.advance()
        self.timer.add(rnd, stage, time.perf_counter() - start)
        return results

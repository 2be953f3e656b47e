"""A task that did not finish: the value every transport (the worker pool, the Flower server) gives for a client's
failed task, kept apart from the pool so that the transports and the round loop take it without importing the pool."""

from __future__ import annotations

from typing import Optional

__all__ = ["TaskFailure"]


class TaskFailure:
    """A task that did not finish: ``reason`` says why (the exception, a timeout, a worker process that died, a
    node that did not reply); ``step`` names the client step when it is not the stage that ran the task."""

    def __init__(self, reason: str, step: Optional[str] = None) -> None:
        self.reason, self.step = reason, step

    def __repr__(self) -> str:
        return f"TaskFailure({self.reason!r})"

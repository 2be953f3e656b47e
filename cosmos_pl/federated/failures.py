"""What happens when a client misbehaves: settings, records and the errors that stop a run.

A client's step that raises, gives a non-finite loss (``DivergenceError``), runs past ``timeout_s`` or loses its
worker process, and an upload that fails :func:`cosmos_pl.uploads.check_upload`, make the client *failed* for the
round: with ``on_error: skip`` it is left out of the rest of the round (its upload is not aggregated; a cluster
with no valid upload keeps its teacher), it keeps the model it had when the round began, and the failure is
recorded (``clients.csv`` columns ``failed_step`` and ``failure``, the log, ``summary.json``). Errors in the
settings or the data (ConfigError, DataError) are never a client's failure: they stop the run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, Optional

from cosmos_pl.errors import UserError, check

__all__ = ["FailureConfig", "Failure", "ClientFailed", "RoundFailed"]


@dataclass
class FailureConfig:
    """How a run treats failing clients.

    Args:
        on_error: 'skip' (default): leave a failed client out of the round and go on; 'abort': stop at the first
            failure, keeping the last complete round's checkpoint.
        timeout_s: seconds one client step (training, pseudo-labels) may run before the client is failed; null: no
            limit. In the parallel executor the worker is killed and replaced; in the sequential one the step is
            interrupted at its next Python instruction.
        min_fraction: the fewest clients, as a fraction of all, that must finish a round; below it the round is not
            committed and the run stops with a message.
    """

    on_error: Literal["skip", "abort"] = "skip"
    timeout_s: Optional[float] = None
    min_fraction: float = 0.5

    def __post_init__(self) -> None:
        """Raises ConfigError for a value out of range."""
        check(self.on_error in ("skip", "abort"), "failures.on_error", self.on_error, "use 'skip' or 'abort'")
        check(self.timeout_s is None or (math.isfinite(self.timeout_s) and self.timeout_s > 0), "failures.timeout_s",
              self.timeout_s, "must be > 0 seconds, or null for no limit")
        check(0 <= self.min_fraction <= 1, "failures.min_fraction", self.min_fraction, "must lie in [0, 1]")


@dataclass(frozen=True)
class Failure:
    """One client's failure in one round: the step ('local training', 'pseudo-labels', 'upload', 'client
    distillation', ...) and the reason (the exception, the timeout, the rejected upload's check)."""

    round: int
    client: int
    step: str
    reason: str

    def as_dict(self) -> dict:
        return {"round": self.round, "client": self.client, "step": self.step, "reason": self.reason}


class ClientFailed(UserError):
    """A client failed and ``failures.on_error`` is 'abort'."""


class RoundFailed(UserError):
    """Fewer than ``failures.min_fraction`` of the clients finished a round; it was not committed."""

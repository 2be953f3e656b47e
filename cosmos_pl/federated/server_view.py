"""What a transport's clients are given of the server: the narrow seam between the round loop and the clients.

A :class:`~cosmos_pl.federated.clients.Clients` implementation is built from a :class:`ServerView`, never from the
round loop itself: U and its fingerprint, the class list, the communication settings, the client runtime, where to
print, record, time and report the losses that arrive late, and the reference weights an uploaded state dict must
match. Nothing in it is a client's data or model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch
from rich.console import Console

from cosmos_pl.communication import CommunicationConfig
from cosmos_pl.runs.recorder import Recorder
from cosmos_pl.federated.server_data import ServerData
from cosmos_pl.execution.tasks import TaskRunner
from cosmos_pl.objectives.runtime import ClientRuntime

__all__ = ["ServerView"]


@dataclass
class ServerView:
    """The server as a transport's clients see it.

    Attributes:
        data: U (uint8 ``[n, C, H, W]``) and the class list.
        fingerprint: U's fingerprint, tagged on every upload.
        communication: how uploads are encoded.
        runtime: the settings every client step reads (seed, clients, transformations, trainer, U, M).
        rounds: R, the last round (a node keeps its final model then).
        reply_timeout_s: ``failures.timeout_s``: seconds a client's task or reply may take (None: no limit).
        console: where lines are printed.
        recorder: the run's records (a transport writes its own files, e.g. ``traffic.csv``, into its directory).
        run_tasks: runs independent tasks on the executor, timed per stage and round (its ``timer``).
        reference: ``client id -> the float tensors its weights must match`` (the server's own copy of the client's
            reported architecture), for uploaded weights.
        report_losses: ``(round, [(stage, client, {name: value}), ...])``: steps' last-epoch losses that arrived
            after the steps (a transport that carries steps on later messages); the round's means are then settled
            again.
    """

    data: ServerData
    fingerprint: str
    communication: CommunicationConfig
    runtime: ClientRuntime
    rounds: int
    reply_timeout_s: Optional[float]
    console: Console
    recorder: Recorder
    run_tasks: TaskRunner
    reference: Callable[[int], dict[str, torch.Tensor]]
    report_losses: Callable[[int, list[tuple[str, int, dict[str, float]]]], None]

    @property
    def public(self) -> torch.Tensor:
        """U, uint8 ``[n, C, H, W]``."""
        return self.data.public

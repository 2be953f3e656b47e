"""A round's bookkeeping on the server: which clients failed it and why, and the clients' losses per stage.

A client whose step fails (an exception, a non-finite loss, a timeout, a lost worker or node, a rejected upload) is
failed for the round: it goes back to the model it had when the round began and sits out the rest of the round
(``failures.on_error: skip``), or the run stops (``abort``). A round that fewer than ``failures.min_fraction`` of
the clients finish is not committed. Losses are the clients' last-epoch losses per stage, averaged over the clients
that have not failed this round.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from cosmos_pl.execution.task_failure import TaskFailure
from cosmos_pl.federated.failures import ClientFailed, Failure, FailureConfig, RoundFailed

__all__ = ["RoundState"]


class RoundState:
    """Failures (this round's and all rounds') and stage losses of a run.

    Args:
        config: the failure policy.
        num_clients: N.
        roll_back: ``(round, client)``: a failed client goes back to its round-start model.
        log: prints one line.
    """

    def __init__(self, config: FailureConfig, num_clients: int, roll_back: Callable[[int, int], None],
                 log: Callable[[str], None]) -> None:
        self.config, self.num_clients, self.roll_back, self.log = config, num_clients, roll_back, log
        self.failures: list[Failure] = []  # every failure so far, all rounds
        self.failed: dict[int, Failure] = {}  # this round's
        self.client_losses: dict[str, dict[int, dict[str, float]]] = {}  # this round's, per stage and client
        self.stage_losses: dict[int, dict[str, float]] = {}  # per round: mean losses, clients' and the server's

    def begin(self, participants: Optional[int] = None) -> None:
        """A new round, taken part in by ``participants`` clients (default: all N; fewer with clients_per_round):
        the count ``failures.min_fraction`` is taken of."""
        self.failed, self.client_losses = {}, {}
        self.participants = self.num_clients if participants is None else participants

    def record(self, rnd: int, stage: str, results: dict[int, Any]) -> None:
        """Keep each client's last-epoch losses of ``stage``; a failed one (a TaskFailure) fails for the round."""
        for i, losses in results.items():
            if isinstance(losses, TaskFailure):
                self.fail(rnd, i, losses.step or stage, losses.reason)
            elif losses:
                self.client_losses.setdefault(stage, {})[i] = losses[-1]
        self.settle(rnd)

    def keep(self, stage: str, client: int, losses: dict[str, float]) -> None:
        """A step's last-epoch losses that arrived after the step (a transport that carries steps on messages)."""
        self.client_losses.setdefault(stage, {})[client] = losses

    def settle(self, rnd: int) -> None:
        """The round's mean last-epoch loss per client stage, over the clients that have not failed this round
        (a client that fails later in the round drops out of every mean, as if it had sat the round out)."""
        row = self.stage_losses.setdefault(rnd, {})
        for stage, per_client in self.client_losses.items():
            last = [parts for i, parts in sorted(per_client.items()) if i not in self.failed]
            for key in sorted({k for parts in per_client.values() for k in parts}):
                values = [parts[key] for parts in last if key in parts]
                name = f"{stage.replace(' ', '_')}_{key}"
                if values:
                    row[name] = sum(values) / len(values)
                else:
                    row.pop(name, None)

    def fail(self, rnd: int, client: int, step: str, reason: str) -> None:
        """Mark ``client`` failed in ``step`` of round ``rnd`` (once: its first failure is the one recorded).

        Raises:
            ClientFailed: ``failures.on_error`` is 'abort'.
        """
        if client in self.failed:
            return
        failure = Failure(rnd, client, step, reason)
        self.failed[client] = failure
        self.failures.append(failure)
        self.roll_back(rnd, client)
        self.log(f"round {rnd}: client {client} failed in {step}: {reason}")
        if self.config.on_error == "abort":
            raise ClientFailed(f"round {rnd}: client {client} failed in {step} ({reason}) and failures.on_error is "
                               "'abort': the run stops at the last complete round")

    def check_fraction(self, rnd: int) -> None:
        """Raises RoundFailed: fewer than ``failures.min_fraction`` of the clients taking part in the round (or none)
        finished it."""
        taking_part = getattr(self, "participants", self.num_clients)
        ok = taking_part - len(self.failed)
        if ok < self.config.min_fraction * taking_part or ok == 0:
            first = next(iter(self.failed.values()))
            raise RoundFailed(f"round {rnd}: only {ok} of {taking_part} clients finished it (failures.min_fraction"
                              f" = {self.config.min_fraction}), so it is not committed and the run stops at the last "
                              f"complete round; every failure is in the log above, the first: client {first.client} "
                              f"in {first.step}: {first.reason}")

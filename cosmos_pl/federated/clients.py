"""The one interface between the round loop and the clients.

The server side (the round loop, the algorithm, the records, the checkpoints) holds U, the class list and what each
client reports about itself (:class:`ClientInfo`): never a client's data or model. Everything a client does goes
through a :class:`Clients`: train a step on the targets the server sent, upload (pseudo-labels on U, or weights for
FedAvg), load weights, and, at the end of a round, score its own model and the models the server sends it for
evaluation (COSMOS: its cluster teacher h_pi(i)) on its own test and validation splits, then keep (or, if it failed
the round, roll back) its model.

Two implementations: :class:`cosmos_pl.federated.in_process.InProcessClients` (this process and its executor's
workers hold the clients' models and data; a simulation, which also knows the true groups) and
:class:`cosmos_pl.flower.server.FlowerClients` (each client's node holds them; a deployment, which knows nothing of
the sort). Both run the same client runtime (:class:`cosmos_pl.objectives.runtime.ClientRuntime`), and both are
built from a :class:`~cosmos_pl.federated.server_view.ServerView`, never from the round loop itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from torch import nn

from cosmos_pl.objectives.step import ClientStep

__all__ = ["ClientInfo", "Clients", "Scores", "SimulationFacts"]

# {(client id, "test" | "val"): {model name ("client", "teacher", ...): {"top1": ..., "top5": ...}}}
Scores = dict[tuple[int, str], dict[str, dict[str, float]]]


@dataclass(frozen=True)
class ClientInfo:
    """What a client reports about itself, and all the server knows of it.

    Attributes:
        id: the client id, 0..N-1 (seeds its stages: the same numbers on every transport).
        backbone: its architecture's name.
        train_size: |D_i|, the samples it trains on (FedAvg weights its average by them).
        test_size: the samples of its test split.
        validation_size: the samples of its validation split (0: none).
        parameters: its model's parameter count (what parameter averaging would move).
    """

    id: int
    backbone: str
    train_size: int
    test_size: int
    validation_size: int = 0
    parameters: int = 0


@dataclass
class SimulationFacts:
    """What only a simulation knows (the partition it made), for reports only: no algorithm reads it.

    Attributes:
        groups: each client's true group id ``[N]``, or None (a partitioner without groups).
        partition: ``partition.json``'s per-client fields (class counts, groups, class groups).
    """

    groups: Optional[list[int]]
    partition: dict[str, Any] = field(default_factory=dict)


class Clients:
    """The clients of one run, as the round loop sees them (see the module docstring).

    Every method that runs something on clients returns ``{client id: result}``, a failed client's result being a
    :class:`~cosmos_pl.execution.task_failure.TaskFailure` with the reason (and the step, when it is not the stage that
    was asked): the round loop records it and goes on with the others.
    """

    infos: list[ClientInfo]

    def begin_round(self, rnd: int) -> None:
        """Remember each client's model as the round begins: what a client that fails the round goes back to."""

    def train(self, rnd: int, step: ClientStep, ids: list[int], targets: dict[int, Any]) -> dict[int, Any]:
        """Train each listed client for one step on what the server sent it (``targets[id]``; none for a step
        without a target): ``{id: per-epoch losses (possibly empty: not known yet) or TaskFailure}``."""
        raise NotImplementedError

    def upload(self, rnd: int, kind: str, ids: list[int]) -> dict[int, Any]:
        """What each listed client sends: its encoded pseudo-labels on U (a
        :class:`~cosmos_pl.communication.Payload`; ``kind`` soft or hard), or for ``kind == "weights"`` the float
        tensors of its model's state dict."""
        raise NotImplementedError

    def load_weights(self, rnd: int, states: dict[int, dict[str, Any]]) -> dict[int, Any]:
        """Replace the listed clients' weights by the server's (FedAvg): ``{id: None or TaskFailure}``."""
        raise NotImplementedError

    def fail(self, rnd: int, client: int) -> None:
        """``client`` failed round ``rnd``: it goes back to the model it had when the round began."""

    def end_round(self, rnd: int, models: dict[int, dict[str, nn.Module]], *,
                  evaluate: bool) -> tuple[Scores, dict[int, Any]]:
        """The end of round ``rnd``: each client keeps its model (a failed one its round-start model) and, with
        ``evaluate``, scores its own model f_i (as ``"client"``) and the models the server sends it (``models[id]``,
        e.g. ``{"teacher": h_pi(i)}``) on its own splits.

        Returns:
            ``(scores, failures)``: the scores of every client that has them, and ``{id: TaskFailure}`` for the
            clients whose end of round failed (a step that rode on this message, a lost node).
        """
        raise NotImplementedError

    def pretrain(self, epochs: int, cache: Any = None, key: str = "") -> dict[int, Any]:
        """Round 0: ``epochs`` of cross-entropy on each client's own data, like :meth:`train` with a LocalFit; the
        in-process clients may load the models of an earlier run with the same settings from ``cache`` (a folder),
        keyed by ``key`` (the settings that decide round 0)."""
        raise NotImplementedError

    def round0_losses(self) -> Optional[dict[str, float]]:
        """Round 0's mean losses when its models were loaded, not trained (:meth:`pretrain` from a cache), else
        None."""
        return None

    def pretrained(self, losses: Optional[dict[str, float]]) -> None:
        """Round 0 ended with these mean ``losses`` (None: a client failed it); the in-process clients keep its
        models in the cache then."""

    def simulation(self) -> Optional[SimulationFacts]:
        """What only a simulation knows (true groups), or None in a deployment."""
        return None

    def bytes(self, rnd: int) -> dict[str, int]:
        """Bytes per client of round ``rnd`` beside the protocol's: ``{"evaluation": ..., "setup": ...}`` (the
        models sent for evaluation; U and the config sent to nodes once)."""
        return {"evaluation": 0, "setup": 0}

    def state_dict(self) -> dict[str, Any]:
        """What a resumed run needs of the clients (in-process: their models; a deployment: nothing, the nodes
        keep theirs)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""

    def close(self) -> None:
        """Stop what serves the clients (worker processes)."""

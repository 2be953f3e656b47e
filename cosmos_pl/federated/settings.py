"""A run's settings, apart from its clients' (:class:`~cosmos_pl.training.client.ClientConfig`): the schedule of
rounds and what they are judged by, and the settings of the stages, the executor, uploads, failures and checkpoints
(the config's sections of the same names), as one record the :class:`~cosmos_pl.federated.runner.Runner` is built
from."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from cosmos_pl.communication import CommunicationConfig
from cosmos_pl.runs.checkpoint import CheckpointConfig
from cosmos_pl.execution.executor import ExecutorConfig
from cosmos_pl.federated.failures import FailureConfig
from cosmos_pl.training.config import TrainerConfig
from cosmos_pl.transforms import Transformations

__all__ = ["RunSettings"]


@dataclass
class RunSettings:
    """How a run goes: its rounds, seed, sampled clients and evaluation, and its sections' settings.

    Attributes:
        rounds: R >= 1, communication rounds after round 0.
        seed: the experiment seed; every stage is seeded from (seed, round, stage, id).
        clients_per_round: clients taking part in a round, a count or a fraction of N
            (:func:`~cosmos_pl.federated.sampling.sampled_clients`); None: every client, every round.
        evaluate_every: score the clients every this many rounds, or ``"final"`` (round 0 and the final round
            always).
        headline_metric: ``top1`` or ``top5`` (M >= 20): what summary.json's headline and best round are judged by.
        transformations: T and d (augmentation and the views of r_B).
        trainer: the settings every stage trains with.
        executor: the worker pool the stages run on.
        communication: how uploads are encoded.
        failures: what a failed client or round does.
        checkpoints: how many round checkpoints are kept.
    """

    rounds: int
    seed: int = 0
    clients_per_round: Optional[int | float] = None
    evaluate_every: int | str = 1
    headline_metric: str = "top1"
    transformations: Transformations = field(default_factory=Transformations)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    executor: ExecutorConfig = field(default_factory=ExecutorConfig)
    communication: CommunicationConfig = field(default_factory=CommunicationConfig)
    failures: FailureConfig = field(default_factory=FailureConfig)
    checkpoints: CheckpointConfig = field(default_factory=CheckpointConfig)

"""The clients of a simulation: their models and data in this process, their tasks on the executor's workers.

:class:`InProcessClients` implements :class:`~cosmos_pl.federated.clients.Clients` over a
:class:`~cosmos_pl.data.Federation`: each client's step is a task of the client runtime
(:class:`~cosmos_pl.training.steps.ClientRuntime`) run on the executor (in this process, or in its worker
processes), the same tasks a Flower node runs. Models are replaced, never trained in place (the executor trains
copies), so the model a client had when the round began is what it goes back to when it fails. It also keeps the
round-0 cache (``cosmos-pl compare``: round 0 trained once per seed for every algorithm) and the test-only task
faults, and it alone knows the true groups of the partition (:meth:`InProcessClients.simulation`).
"""

from __future__ import annotations

import copy
import fcntl
import hashlib
from pathlib import Path
from typing import Any, Callable, Optional

import torch
from torch import nn

from cosmos_pl import signals
from cosmos_pl.communication import CommunicationConfig
from cosmos_pl.data import Federation
from cosmos_pl.errors import DivergenceError
from cosmos_pl.federated import faults
from cosmos_pl.federated.clients import ClientInfo, Clients, Scores, SimulationFacts
from cosmos_pl.federated.executor import TaskFailure
from cosmos_pl.files import atomic_save
from cosmos_pl.models import count_parameters
from cosmos_pl.training.client import Client
from cosmos_pl.models.personal import load_shared_weights, personal_model, shared_weights
from cosmos_pl.training.steps import ClientRuntime, ClientStep, LocalFit, Task, encode_upload

__all__ = ["InProcessClients"]


class InProcessClients(Clients):
    """The federation's clients, held here.

    Args:
        federation: the clients' data and U.
        backbones: each client's architecture name ``[N]``.
        models: each client's initial model ``[N]`` (the runner builds them, seeded).
        runtime: the client runtime (settings every step reads).
        comm: how soft uploads are encoded.
        fingerprint: U's fingerprint, tagged on every upload.
        run_tasks: the runner's ``(round, stage, tasks, costs, trains, tolerate) -> [(model, output)]``.
        threads: torch threads per task; shared_init: every client starts from the same weights (both part of the
            round-0 cache key).
        log: prints one line.
    """

    def __init__(self, federation: Federation, backbones: list[str], models: list[nn.Module], runtime: ClientRuntime,
                 comm: CommunicationConfig, fingerprint: str, run_tasks: Callable[..., list[tuple[Any, Any]]],
                 threads: int, shared_init: bool = False, log: Callable[[str], None] = print) -> None:
        self.fed, self.runtime, self.comm, self.fingerprint = federation, runtime, comm, fingerprint
        self.run_tasks, self.threads, self.shared_init, self.log = run_tasks, threads, shared_init, log
        self.clients = [Client(i, name, model, data)
                        for i, (name, model, data) in enumerate(zip(backbones, models, federation.clients))]
        self.infos = [ClientInfo(c.id, c.backbone, len(c.data.y), len(c.data.y_test),
                                 0 if c.data.y_val is None else len(c.data.y_val),
                                 count_parameters(personal_model(c.model)))
                      for c in self.clients]
        self.faults = faults.load()  # test-only fault injection (empty unless COSMOS_PL_TEST_FAULTS is set)
        self._start: dict[int, nn.Module] = {}

    @classmethod
    def of_runner(cls, runner: Any, federation: Federation) -> "InProcessClients":
        """The federation's clients with their initial models, each built by ``runner.make_backbone`` seeded from
        (seed, 0, "init", id), or id 0 for an algorithm whose clients share their initial weights (FedAvg)."""
        from cosmos_pl.training.config import stage_seed

        names, algorithm = runner.ccfg.backbones, runner.algorithm
        backbones = [names[i % len(names)] for i in range(federation.num_clients)]
        algorithm.validate(backbones)
        models = [algorithm.client_model(runner.make_backbone(
            name, stage_seed(runner.seed, 0, "init", 0 if algorithm.shared_init else i)))
            for i, name in enumerate(backbones)]
        # a client's data is the same all run: each worker is sent it once and keeps it (and one GPU copy)
        for i, data in enumerate(federation.clients):
            for split, tensor in (("x", data.x), ("y", data.y), ("x_test", data.x_test), ("y_test", data.y_test),
                                  ("x_val", data.x_val), ("y_val", data.y_val)):
                if tensor is not None:
                    runner.executor.keep_resident(f"client {i} {split}", tensor)
        return cls(federation, backbones, models, runner.runtime, runner.comm, runner.fingerprint, runner.run_tasks,
                   runner.executor.threads, algorithm.shared_init, runner.console.print)

    # ----------------------------------------------------------------- helpers
    def _with_fault(self, rnd: int, stage: str, client: int, task: Task) -> Task:
        kind = faults.find(self.faults, rnd, client, stage) if self.faults else None
        if kind not in faults.TASK_KINDS:
            return task
        fn, kwargs = task
        return faults.run_with_fault, {"_fault_fn": fn, "_fault_kind": kind, **kwargs}

    def _train(self, rnd: int, step: ClientStep, ids: list[int], targets: dict[int, Any]) -> dict[int, Any]:
        tasks = [self._with_fault(rnd, step.stage, i, self.runtime.train(self.clients[i], rnd, step, targets.get(i)))
                 for i in ids]
        costs = [count_parameters(self.clients[i].model) * len(self.clients[i].data.y) for i in ids]
        out = {}
        for i, (model, losses) in zip(ids, self.run_tasks(rnd, step.stage, tasks, costs, trains=True, tolerate=True)):
            if not isinstance(losses, TaskFailure):
                self.clients[i].model = model
            out[i] = losses
        return out

    # ----------------------------------------------------------------- the interface
    def begin_round(self, rnd: int) -> None:
        # models are replaced, never trained in place: these references are the models each client had when the
        # round began, what a failed client keeps
        self._start = {c.id: c.model for c in self.clients}

    def train(self, rnd: int, step: ClientStep, ids: list[int], targets: dict[int, Any]) -> dict[int, Any]:
        return self._train(rnd, step, ids, targets) if ids else {}

    def upload(self, rnd: int, kind: str, ids: list[int]) -> dict[int, Any]:
        if kind == "weights":
            return {i: shared_weights(self.clients[i].model) for i in ids}
        tasks = [self._with_fault(rnd, "pseudo-labels", i, self.runtime.predict(self.clients[i], rnd)) for i in ids]
        costs = [count_parameters(self.clients[i].model) * len(self.runtime.public) for i in ids]
        out: dict[int, Any] = {}
        for i, (_, probs) in zip(ids, self.run_tasks(rnd, "pseudo-labels", tasks, costs, tolerate=True)):
            if isinstance(probs, TaskFailure):
                out[i] = TaskFailure(probs.reason, "pseudo-labels")
                continue
            try:
                out[i] = encode_upload(probs, kind, self.comm, self.fingerprint)
            except DivergenceError as err:
                out[i] = TaskFailure(str(err), "upload")
        return out

    def load_weights(self, rnd: int, states: dict[int, dict[str, Any]]) -> dict[int, Any]:
        for i, state in states.items():  # into a copy: the round-start model stays intact for a failure
            model = copy.deepcopy(self.clients[i].model)
            load_shared_weights(model, state)
            self.clients[i].model = model
        return {i: None for i in states}

    def fail(self, rnd: int, client: int) -> None:
        self.clients[client].model = self._start[client]

    def end_round(self, rnd: int, models: dict[int, dict[str, nn.Module]], evaluate: bool) -> tuple[Scores,
                                                                                                     dict[int, Any]]:
        if not evaluate:
            return {}, {}
        tasks, keys = [], []
        for c in self.clients:
            for split, task in self.runtime.evaluate(c, rnd, {"client": c.model, **models.get(c.id, {})}):
                tasks.append(task)
                keys.append((c.id, split))
        return {key: out for key, (_, out) in zip(keys, self.run_tasks(rnd, "evaluation", tasks))}, {}

    def pretrain(self, epochs: int, cache: Optional[Path] = None, key: str = "") -> dict[int, Any]:
        """Round 0 (see :meth:`Clients.pretrain`). With ``cache`` (a folder), the trained round-0 models are kept
        there under a hash of ``key`` (the settings that decide round 0) plus the thread count and the algorithm's
        initialization; a later run with the same hash loads them instead of training, with identical numbers
        (:attr:`cached_losses` then holds the losses the first run recorded). A file lock lets runs side by side
        wait for each other: it is held until :meth:`keep_round0`."""
        ids = [c.id for c in self.clients]
        self.cached_losses: Optional[dict[str, float]] = None
        if cache is None:
            return self._train(0, LocalFit(epochs), ids, {}) if epochs > 0 else {}
        # the cache holds each client's personal model (personal_model): round 0 trains only that (LocalFit's
        # default part), so FedAvg, Ditto and FedBABU (one shared initialization) read the same file
        digest = hashlib.sha256(f"{key}|threads={self.threads}|shared_init={self.shared_init}"
                                .encode()).hexdigest()[:16]
        cache.mkdir(parents=True, exist_ok=True)
        self._round0 = cache / f"round0-{digest}.pt"
        self._round0_lock = open(cache / f".round0-{digest}.lock", "w")
        fcntl.flock(self._round0_lock, fcntl.LOCK_EX)
        if self._round0.is_file():
            saved = torch.load(self._round0, weights_only=True)
            for c, state in zip(self.clients, saved["models"]):
                personal_model(c.model).load_state_dict(state)
            self.cached_losses = dict(saved["losses"])
            self.log(f"round 0: client models loaded from {self._round0}")
            self.keep_round0(None)
            return {}
        return self._train(0, LocalFit(epochs), ids, {}) if epochs > 0 else {}

    def keep_round0(self, losses: Optional[dict[str, float]]) -> None:
        """After round 0: save its models to the cache with the round's mean ``losses`` (None: not shared, e.g. a
        client failed), and let the next run in."""
        lock = getattr(self, "_round0_lock", None)
        if lock is None:
            return
        try:
            signals.check()  # a round 0 that a stop request interrupted is not shared either
            if losses is not None and not self._round0.is_file():
                atomic_save({"models": [personal_model(c.model).state_dict() for c in self.clients],
                             "losses": losses}, self._round0)
        finally:
            lock.close()
            self._round0_lock = None

    def simulation(self) -> Optional[SimulationFacts]:
        groups = self.fed.partition.groups
        return SimulationFacts(None if groups is None else [int(g) for g in groups],
                               self.fed.partition.to_json(self.fed.partition_labels, self.fed.num_classes))

    def state_dict(self) -> dict[str, Any]:
        return {"models": [c.model.state_dict() for c in self.clients]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for c, weights in zip(self.clients, state["models"]):
            c.model.load_state_dict(weights)

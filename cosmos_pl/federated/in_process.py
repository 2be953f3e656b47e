"""The clients of a simulation: their models and data in this process, their tasks on the executor's workers.

:class:`InProcessClients` implements :class:`~cosmos_pl.federated.clients.Clients` over a
:class:`~cosmos_pl.data.Federation`: each client's step is a task of the client runtime
(:class:`~cosmos_pl.objectives.runtime.ClientRuntime`) run on the executor (in this process, or in its worker
processes), the same tasks a Flower node runs. Models are replaced, never trained in place (the executor trains
copies), so the model a client had when the round began is what it goes back to when it fails. It also sizes the
executor's workers and plans their shared memory from the clients' data it holds, keeps the round-0 cache
(``cosmos-pl compare``: round 0 trained once per seed for every algorithm), and it alone knows the true groups of the
partition (:meth:`InProcessClients.simulation`).
"""

from __future__ import annotations

import copy
import fcntl
import hashlib
import math
from pathlib import Path
from typing import Any, Callable, Optional

import torch
from torch import nn

from cosmos_pl import signals
from cosmos_pl.algorithms.base import Algorithm
from cosmos_pl.communication import CommunicationConfig
from cosmos_pl.data import Federation
from cosmos_pl.errors import DivergenceError
from cosmos_pl.federated.clients import ClientInfo, Clients, Scores, SimulationFacts
from cosmos_pl.execution.executor import Executor
from cosmos_pl.execution.task_failure import TaskFailure
from cosmos_pl.federated.initial_models import client_backbone, initial_model
from cosmos_pl.federated.server_view import ServerView
from cosmos_pl.files import atomic_save
from cosmos_pl.models import count_parameters
from cosmos_pl.models.personal import load_shared_weights, personal_model, shared_weights
from cosmos_pl.objectives.runtime import ClientRuntime, encode_upload
from cosmos_pl.objectives.step import ClientStep
from cosmos_pl.training.client import Client

__all__ = ["InProcessClients"]


class InProcessClients(Clients):
    """The federation's clients, held here.

    Args:
        federation: the clients' data and U.
        backbones: each client's architecture name ``[N]``.
        models: each client's initial model ``[N]`` (:func:`~cosmos_pl.federated.initial_models.initial_model`).
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
        self._start: dict[int, nn.Module] = {}
        self.cached_losses: Optional[dict[str, float]] = None

    @classmethod
    def build(cls, view: ServerView, *, federation: Federation, executor: Executor, algorithm: Algorithm,
              server_model_bytes: Callable[[], int]) -> "InProcessClients":
        """The federation's clients with their initial models
        (:func:`~cosmos_pl.federated.initial_models.initial_model`), their data resident on ``executor``'s workers;
        then ``executor``'s workers sized and their shared memory planned (:meth:`size_workers`).

        Args:
            server_model_bytes: float32 bytes of the largest server-side model (a teacher; 0 without one).

        Raises:
            ConfigError: ``/dev/shm`` cannot hold the data of the parallel workers asked for
                (:meth:`Executor.plan_shared_memory`).
        """
        runtime, data = view.runtime, view.data
        backbones = [client_backbone(runtime.clients.backbones, i) for i in range(federation.num_clients)]
        models = [initial_model(algorithm, name, i, runtime.seed, data.num_classes, data.in_chans, data.image_shape)
                  for i, name in enumerate(backbones)]
        # a client's data is the same all run: each worker is sent it once and keeps it (and one GPU copy)
        for i, client_data in enumerate(federation.clients):
            for split, tensor in (("x", client_data.x), ("y", client_data.y), ("x_test", client_data.x_test),
                                  ("y_test", client_data.y_test), ("x_val", client_data.x_val),
                                  ("y_val", client_data.y_val)):
                if tensor is not None:
                    executor.keep_resident(f"client {i} {split}", tensor)
        clients = cls(federation, backbones, models, runtime, view.communication, view.fingerprint, view.run_tasks,
                      executor.threads, algorithm.shared_init, view.console.print)
        clients.size_workers(executor, data.in_chans * math.prod(data.image_shape), view.public.numel(),
                             server_model_bytes)
        return clients

    def size_workers(self, executor: Executor, sample_bytes: int, public_bytes: int,
                     server_model_bytes: Callable[[], int]) -> None:
        """``executor.workers_per_device: auto`` on GPUs: workers per GPU from the largest model (a client's or a
        teacher's, ``server_model_bytes()``) and the data a worker may keep on its GPU (every client's training set
        and U, ``sample_bytes`` each for a client's sample); then, for a parallel executor, whether the clients' data
        and U fit in ``/dev/shm`` to be shared by the workers (:meth:`Executor.plan_shared_memory`). Each decision
        the executor takes itself is logged as one line.

        Raises:
            ConfigError: ``/dev/shm`` cannot hold the data of the parallel workers asked for.
        """
        infos = self.infos
        if executor.cfg.workers_per_device == "auto" and any(d is not None for d in executor.devices):
            line = executor.size_workers(
                parameters=max([c.parameters for c in infos] + [server_model_bytes() // 4]),
                # a worker may come to hold a GPU copy of every client's training data and of U (keep_resident)
                data_bytes=sum(c.train_size for c in infos) * sample_bytes + public_bytes, tasks=len(infos))
            if line:
                self.log(line)
        line = executor.plan_shared_memory()
        if line:
            self.log(line)
        self.threads = executor.threads  # the round-0 cache is keyed by the threads per task

    # ----------------------------------------------------------------- helpers
    def _train(self, rnd: int, step: ClientStep, ids: list[int], targets: dict[int, Any]) -> dict[int, Any]:
        tasks = [self.runtime.train(self.clients[i], rnd, step, targets.get(i)) for i in ids]
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
        tasks = [self.runtime.predict(self.clients[i], rnd) for i in ids]
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

    def end_round(self, rnd: int, models: dict[int, dict[str, nn.Module]], *,
                  evaluate: bool) -> tuple[Scores, dict[int, Any]]:
        if not evaluate:
            return {}, {}
        priors = self._teacher_priors(rnd, models)
        tasks, keys = [], []
        for c in self.clients:
            scored = {"client": c.model, **models.get(c.id, {})}
            for split, task in self.runtime.evaluate(c, rnd, scored, priors.get(id(scored.get("teacher")))):
                tasks.append(task)
                keys.append((c.id, split))
        return {key: out for key, (_, out) in zip(keys, self.run_tasks(rnd, "evaluation", tasks))}, {}

    def _teacher_priors(self, rnd: int, models: dict[int, dict[str, nn.Module]]) -> dict[int, torch.Tensor]:
        """The prior each distinct ``"teacher"`` in ``models`` carries (its mean output on U, ``[M]``), by the
        teacher's id: one pass over U per teacher, not one per client and split."""
        teachers: dict[int, tuple[nn.Module, list[int]]] = {}
        for c in self.clients:
            teacher = models.get(c.id, {}).get("teacher")
            if teacher is not None:
                teachers.setdefault(id(teacher), (teacher, []))[1].append(c.id)
        if not teachers or len(self.runtime.public) == 0:
            return {}
        tasks = [self.runtime.prior(teacher, rnd, f"the teacher of client(s) {ids}")
                 for teacher, ids in teachers.values()]
        return {key: prior for key, (_, prior) in zip(teachers, self.run_tasks(rnd, "teacher priors", tasks))}

    def pretrain(self, epochs: int, cache: Optional[Path] = None, key: str = "") -> dict[int, Any]:
        """Round 0 (see :meth:`Clients.pretrain`). With ``cache`` (a folder), the trained round-0 models are kept
        there under a hash of ``key`` (the settings that decide round 0) plus the thread count and the algorithm's
        initialization; a later run with the same hash loads them instead of training, with identical numbers
        (:meth:`round0_losses` then returns the losses the first run recorded). A file lock lets runs side by side
        wait for each other: it is held until :meth:`pretrained`."""
        from cosmos_pl.objectives.local_fit import LocalFit  # Lightning: imported where training starts

        ids = [c.id for c in self.clients]
        self.cached_losses = None
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
            self.pretrained(None)
            return {}
        return self._train(0, LocalFit(epochs), ids, {}) if epochs > 0 else {}

    def round0_losses(self) -> Optional[dict[str, float]]:
        return None if self.cached_losses is None else dict(self.cached_losses)

    def pretrained(self, losses: Optional[dict[str, float]]) -> None:
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

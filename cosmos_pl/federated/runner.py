"""The one round loop every algorithm runs on.

Round 0: every client trains E0 epochs on its labelled data (the local-only baseline, the same for every
algorithm). Rounds 1..R: the algorithm's plan, step by step (local fit, upload and the server step, distill,
joint or union fit, load weights). After every round each client is scored on its own test set with its own
model f_i and with whatever models the algorithm names (COSMOS: its cluster teacher h_pi(i)); the rows are
written at once.

The runner owns uploads and their encoding (exact byte counts), the executor, evaluation and the records; an
algorithm (``cosmos_pl.algorithms``) owns only its server step and its state.

Issue 9: after every round the whole state goes to a round checkpoint (``federated.checkpoint``) and a run can
continue from it exactly; a client whose step fails, times out or uploads something malformed is left out of
that round (``federated.failures``) and every upload is checked before aggregation (``cosmos_pl.uploads``).
"""

from __future__ import annotations

import copy
import fcntl
import hashlib
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from sklearn.metrics import adjusted_rand_score
from torch import nn

from cosmos_pl.algorithms.base import (
    Algorithm, Distill, FederationContext, JointFit, LoadWeights, LocalFit, ServerResult, UnionFit, Upload,
)
from cosmos_pl.communication import CommunicationConfig, decode, state_dict_bytes
from cosmos_pl import signals
from cosmos_pl.data import Federation
from cosmos_pl.errors import ConfigError, DivergenceError
from cosmos_pl.federated import checkpoint, faults
from cosmos_pl.federated.checkpoint import CheckpointConfig
from cosmos_pl.federated.client import Client, ClientConfig
from cosmos_pl.federated.executor import Executor, ExecutorConfig, Task, TaskFailure
from cosmos_pl.federated.failures import ClientFailed, Failure, FailureConfig, RoundFailed
from cosmos_pl.federated.recorder import Recorder
from cosmos_pl.federated.run_directory import atomic_save
from cosmos_pl.federated.client_steps import ClientSteps, encode_upload, stage_of
from cosmos_pl.federated.trainer_config import TrainerConfig, stage_seed
from cosmos_pl.models import check_backbones, count_parameters, create_backbone
from cosmos_pl.report import METRIC_LABEL, mean_sem
from cosmos_pl.transforms import Transformations
from cosmos_pl.uploads import RejectedUpload, UploadSpec, check_upload, check_weights, public_fingerprint

__all__ = ["Runner"]

_ACC_KEYS = ("teacher_acc", "client_acc", "teacher_top5", "client_top5", "teacher_val_acc", "client_val_acc")


@dataclass
class _Timer:
    """Seconds per stage, in total and per round."""

    seconds: dict[str, float] = field(default_factory=dict)
    by_round: dict[str, dict[str, float]] = field(default_factory=dict)

    def add(self, rnd: int, stage: str, elapsed: float) -> None:
        self.seconds[stage] = self.seconds.get(stage, 0.0) + elapsed
        per = self.by_round.setdefault(str(rnd), {})
        per[stage] = per.get(stage, 0.0) + elapsed


class Runner:
    """Runs one algorithm over one federation: round 0, then ``rounds`` rounds of the algorithm's plan.

    Args:
        federation: clients' data, the public set U ``[n, C, H, W]`` (inputs only) and the partition.
        algorithm: the method (``cosmos_pl.algorithms``); :meth:`Algorithm.setup` is called here.
        clients: the clients' settings (backbones, epochs, optimizers).
        rounds: R >= 1, communication rounds after round 0.
        seed: the experiment seed; every stage is seeded from (seed, round, stage, id).
        transformations: T and d (augmentation on labelled data, views of r_B).
        trainer: devices/precision of every stage; executor: where independent tasks run.
        communication: how soft uploads are encoded.
        recorder: where rows go (default: kept in memory only); with a run directory, round checkpoints go to
            its ``checkpoints/`` folder.
        console: where progress and per-round lines are printed.
        failures: what a failing client does to the round (default: it is skipped).
        checkpoints: how many round checkpoints to keep (default 2).
        checkpoint_meta: plain values stored in every checkpoint (the CLI's config hash and W&B run id).
        headline_metric: ``top1`` or ``top5`` (M >= 20): what summary.json's headline and best round are judged by.

    Raises:
        ValueError: bad settings, or a federation the algorithm cannot run (naming the field and the fix).
        ConfigError: a client's or the server's backbone cannot take the data's images (a dry forward pass of
            each distinct backbone before any model is trained, :func:`cosmos_pl.models.check_backbones`).
    """

    def __init__(self, federation: Federation, algorithm: Algorithm, clients: ClientConfig, *, rounds: int,
                 seed: int = 0, transformations: Optional[Transformations] = None,
                 trainer: Optional[TrainerConfig] = None, executor: Optional[ExecutorConfig] = None,
                 communication: Optional[CommunicationConfig] = None, recorder: Optional[Recorder] = None,
                 console: Optional[Console] = None, failures: Optional[FailureConfig] = None,
                 checkpoints: Optional[CheckpointConfig] = None,
                 checkpoint_meta: Optional[dict[str, Any]] = None, headline_metric: str = "top1") -> None:
        if rounds < 1:
            raise ValueError(f"rounds={rounds}: at least 1 communication round is needed")
        if not clients.backbones:
            raise ValueError("clients.backbones is empty: give at least one timm/torchvision name")
        self.fed, self.algorithm, self.ccfg, self.rounds, self.seed = federation, algorithm, clients, rounds, seed
        self.transformations = transformations if transformations is not None else Transformations()
        self.tcfg = trainer or TrainerConfig()
        self.comm = communication or CommunicationConfig()
        self.recorder = recorder or Recorder()
        self.console = console or Console()
        self.executor = Executor(executor or ExecutorConfig(), self.tcfg.accelerator)
        self.failure_cfg = failures or FailureConfig()
        self.checkpoint_cfg = checkpoints or CheckpointConfig()
        self.checkpoint_meta = dict(checkpoint_meta or {})
        self.headline_metric = headline_metric
        self.timer = _Timer()
        self.round_seconds: dict[int, float] = {}
        self.public = federation.public_x
        self.fingerprint = public_fingerprint(self.public)
        self.faults = faults.load()  # test-only fault injection (empty unless COSMOS_PL_TEST_FAULTS is set)
        self.failures: list[Failure] = []  # every failure so far, all rounds
        self._failed: dict[int, Failure] = {}  # this round's
        self._client_losses: dict[str, dict[int, dict[str, float]]] = {}  # this round's, per stage and client
        self._start_models: dict[int, nn.Module] = {}  # each client's model when this round began
        self.last_checkpoint: Optional[Path] = None
        self.previous_wall = 0.0  # seconds spent before a resume
        self.stage_losses: dict[int, dict[str, float]] = {}
        self.clusters_info: dict[str, Any] = {}
        backbones = [clients.backbones[i % len(clients.backbones)] for i in range(federation.num_clients)]
        algorithm.validate(backbones)
        used = range(min(len(clients.backbones), federation.num_clients))
        check_backbones({**{f"clients.backbones[{j}]": clients.backbones[j] for j in used},
                         **algorithm.server_backbones()},
                        federation.num_classes, (federation.in_chans, *federation.image_shape))
        init_id = (lambda i: 0) if algorithm.shared_init else (lambda i: i)
        self.steps = ClientSteps(seed, clients, self.transformations, self.tcfg, self.public, federation.num_classes)
        self.clients = [Client(i, name, self.make_backbone(name, stage_seed(seed, 0, "init", init_id(i))), data)
                        for i, (name, data) in enumerate(zip(backbones, federation.clients))]
        algorithm.setup(FederationContext(
            num_clients=federation.num_clients, num_classes=federation.num_classes, public=self.public,
            backbones=backbones, client_sizes=[len(d.y) for d in federation.clients], seed=seed,
            stage_seed=lambda rnd, stage, i: stage_seed(seed, rnd, stage, i), make_backbone=self.make_backbone,
            run_tasks=self.run_tasks, trainer=self.tcfg, transformations=self.transformations,
            local_epochs=clients.local_epochs, distill_epochs=clients.distill_epochs, log=self.console.print))

    # ----------------------------------------------------------------- services
    def make_backbone(self, name: str, seed: int) -> nn.Module:
        """A Kaiming-initialized backbone for this federation's images, created under ``torch.manual_seed(seed)``."""
        torch.manual_seed(seed)
        return create_backbone(name, self.fed.num_classes, self.fed.in_chans, max(self.fed.image_shape))

    def run_tasks(self, rnd: int, stage: str, tasks: list[Task], costs: Optional[list[float]] = None,
                  trains: bool = False, tolerate: bool = False) -> list[tuple[Any, Any]]:
        """Run one stage's independent tasks on the executor; returns ``(model, output)`` in task order. With
        ``tolerate`` (client tasks) a failed task's output is a :class:`TaskFailure` and ``failures.timeout_s``
        applies; otherwise a failure raises (server tasks: a teacher that fails stops the run)."""
        start = time.perf_counter()
        results: list[Any] = [None] * len(tasks)
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=self.console, transient=True) as bar:
            task = bar.add_task(f"round {rnd}: {stage}", total=len(tasks))
            timeout = self.failure_cfg.timeout_s if tolerate else None
            for i, model, out in self.executor.map(tasks, costs, returns_model=trains, tolerate=tolerate,
                                                   timeout_s=timeout):
                results[i] = (model, out)
                bar.advance(task)
        self.timer.add(rnd, stage, time.perf_counter() - start)
        return results

    def _train(self, rnd: int, ids: list[int], step: Any, targets: Optional[dict[int, Any]] = None) -> None:
        """Train each listed client for one ``step`` (``targets``: what the server sent each) and keep its last
        epoch's losses; a client whose step fails is failed for the round."""
        if not ids:
            return
        stage = stage_of(step)
        for i, losses in self._client_train(rnd, stage, ids, step, targets or {}).items():
            if isinstance(losses, TaskFailure):
                self._fail(rnd, i, losses.step or stage, losses.reason)
            elif losses:
                self._client_losses.setdefault(stage, {})[i] = losses[-1]
        self._settle_losses(rnd)

    # ----------------------------------------------------------------- the in-process transport
    # Four methods move work to and from the clients; a multi-machine transport (cosmos_pl.flower) overrides them
    # and everything else (the round loop, checks, aggregation, records) stays the same.
    def _client_train(self, rnd: int, stage: str, ids: list[int], step: Any,
                      targets: dict[int, Any]) -> dict[int, Any]:
        """Run one training step on the listed clients: ``{id: per-epoch losses or TaskFailure}``."""
        tasks = [self._with_fault(rnd, stage, i, self.steps.train(self.clients[i], rnd, step, targets.get(i)))
                 for i in ids]
        costs = [count_parameters(self.clients[i].model) * len(self.clients[i].data.y) for i in ids]
        out = {}
        for i, (model, losses) in zip(ids, self.run_tasks(rnd, stage, tasks, costs, trains=True, tolerate=True)):
            if not isinstance(losses, TaskFailure):
                self.clients[i].model = model
            out[i] = losses
        return out

    def _client_uploads(self, rnd: int, kind: str, ids: list[int]) -> dict[int, Any]:
        """The listed clients' encoded pseudo-labels on U: ``{id: Payload or TaskFailure}`` (``kind``: soft or
        hard), or their float state dicts for ``kind == "weights"``."""
        if kind == "weights":
            return {i: {k: v.detach().clone() for k, v in self.clients[i].model.state_dict().items()
                        if v.is_floating_point()} for i in ids}
        tasks = [self._with_fault(rnd, "pseudo-labels", i, self.steps.predict(self.clients[i], rnd)) for i in ids]
        costs = [count_parameters(self.clients[i].model) * len(self.public) for i in ids]
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

    def _client_load_weights(self, rnd: int, states: dict[int, Any]) -> dict[int, Any]:
        """Load the server's weights into the listed clients (FedAvg): ``{id: None or TaskFailure}``."""
        for i, state in states.items():  # into a copy: the round-start model stays intact for a failure
            model = copy.deepcopy(self.clients[i].model)
            model.load_state_dict(state, strict=False)
            self.clients[i].model = model
        return {i: None for i in states}

    def _client_scores(self, rnd: int) -> dict[tuple[int, str], dict[str, dict[str, float]]]:
        """Every client's scores per split: ``{(id, "test"|"val"): {model name: {"top1": ..., ...}}}`` for its own
        f_i (``"client"``) and the algorithm's models for it (COSMOS: ``"teacher"``)."""
        tasks, keys = [], []
        for c in self.clients:
            for split, task in self.steps.evaluate(c, rnd, {"client": c.model, **self.algorithm.eval_models(c.id)}):
                tasks.append(task)
                keys.append((c.id, split))
        return {key: out for key, (_, out) in zip(keys, self.run_tasks(rnd, "evaluation", tasks))}

    def _settle_losses(self, rnd: int) -> None:
        """The round's mean last-epoch loss per client stage, over the clients that have not failed this round
        (a client that fails later in the round drops out of every mean, as if it had sat the round out)."""
        row = self.stage_losses.setdefault(rnd, {})
        for stage, per_client in self._client_losses.items():
            last = [parts for i, parts in sorted(per_client.items()) if i not in self._failed]
            for key in sorted({k for parts in per_client.values() for k in parts}):
                values = [parts[key] for parts in last if key in parts]
                name = f"{stage.replace(' ', '_')}_{key}"
                if values:
                    row[name] = sum(values) / len(values)
                else:
                    row.pop(name, None)

    # ----------------------------------------------------------------- client steps
    def local_fit(self, rnd: int, epochs: int, ids: list[int]) -> None:
        """Cross-entropy on each client's own data D_i (round 0: E0 epochs)."""
        if epochs > 0:
            self._train(rnd, ids, LocalFit(epochs))

    def upload(self, rnd: int, kind: str, ids: list[int]) -> tuple[dict[int, Any], int]:
        """What the listed clients send, checked: ``({id: decoded [n, M] or state dict}, bytes per client)``.

        A client whose prediction fails or whose upload fails :func:`cosmos_pl.uploads.check_upload` is failed
        for the round and its upload is dropped here, before any aggregation."""
        if not ids:
            return {}, 0
        received = {}
        for i, got in self._client_uploads(rnd, kind, ids).items():
            if isinstance(got, TaskFailure):
                self._fail(rnd, i, got.step or "upload", got.reason)
            else:
                received[i] = got
        if kind == "weights":
            if not received:
                return {}, 0
            # the server's own copy of the architecture: the same keys and shapes, whichever upload arrives first
            reference = {k: v for k, v in self.clients[ids[0]].model.state_dict().items() if v.is_floating_point()}
            valid = {}
            for i, state in received.items():
                try:
                    check_weights(state, reference)
                    valid[i] = state
                except RejectedUpload as err:
                    self._fail(rnd, i, "upload", f"rejected: {err}")
            return valid, max(state_dict_bytes(s) for s in received.values())
        hard = kind == "hard"
        spec = UploadSpec(len(self.public), self.fed.num_classes, "index" if hard else self.comm.upload_dtype,
                          None if hard else self.comm.top_k, self.fingerprint)
        decoded, sizes = {}, []
        for i, payload in received.items():
            fault = faults.find(self.faults, rnd, i, "upload")
            if fault in faults.UPLOAD_KINDS:
                payload = faults.corrupt(payload, fault)
            try:
                check_upload(payload, spec)
            except RejectedUpload as err:
                self._fail(rnd, i, "upload", f"rejected: {err}")
                continue
            sizes.append(payload.nbytes)  # what one accepted upload costs
            decoded[i] = decode(payload)
        return decoded, max(sizes, default=0)

    # ----------------------------------------------------------------- rounds
    def pretrain(self, cache: Optional[Path] = None, key: str = "") -> None:
        """Round 0: E0 local epochs for every client.

        With ``cache`` (a folder), the trained round-0 client models are kept there under a hash of ``key`` (the
        settings that decide round 0) plus the executor's thread count and the algorithm's initialization; a later
        run with the same hash loads them instead of training: ``cosmos-pl compare`` trains round 0 once per seed
        for all its algorithms, with identical numbers. A file lock lets runs side by side wait for each other.
        """
        ids = [c.id for c in self.clients]
        self._begin_round()
        if cache is None:
            self.local_fit(0, self.ccfg.pretrain_epochs, ids)
            self._check_fraction(0)
            return
        digest = hashlib.sha256(f"{key}|threads={self.executor.threads}|shared_init={self.algorithm.shared_init}"
                                .encode()).hexdigest()[:16]
        cache.mkdir(parents=True, exist_ok=True)
        path = cache / f"round0-{digest}.pt"
        with open(cache / f".round0-{digest}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if path.is_file():
                saved = torch.load(path, weights_only=True)
                for c, state in zip(self.clients, saved["models"]):
                    c.model.load_state_dict(state)
                self.stage_losses[0] = dict(saved["losses"])
                self.console.print(f"round 0: client models loaded from {path}")
                return
            self.local_fit(0, self.ccfg.pretrain_epochs, ids)
            self._check_fraction(0)
            if self._failed:  # a round 0 with failed clients is not shared with other runs
                return
            signals.check()  # nor one that a stop request interrupted
            atomic_save({"models": [c.model.state_dict() for c in self.clients],
                         "losses": self.stage_losses.get(0, {})}, path)

    # ----------------------------------------------------------------- failures
    def _begin_round(self) -> None:
        self._failed = {}
        self._client_losses = {}
        # models are replaced, never trained in place (the executor trains copies): these references are the
        # models each client had when the round began, what a failed client keeps
        self._start_models = {c.id: c.model for c in self.clients}

    def _with_fault(self, rnd: int, stage: str, client: int, task: Task) -> Task:
        kind = faults.find(self.faults, rnd, client, stage) if self.faults else None
        if kind not in faults.TASK_KINDS:
            return task
        fn, kwargs = task
        return faults.run_with_fault, {"_fault_fn": fn, "_fault_kind": kind, **kwargs}

    def _fail(self, rnd: int, client: int, step: str, reason: str) -> None:
        """Mark ``client`` failed in ``step`` of round ``rnd``: it keeps its model from the round's start and sits
        out the rest of the round (``failures.on_error: skip``), or the run stops (``abort``)."""
        failure = Failure(rnd, client, step, reason)
        self._failed[client] = failure
        self.failures.append(failure)
        self.clients[client].model = self._start_models[client]
        self.console.print(f"round {rnd}: client {client} failed in {step}: {reason}")
        if self.failure_cfg.on_error == "abort":
            raise ClientFailed(f"round {rnd}: client {client} failed in {step} ({reason}) and failures.on_error is "
                               "'abort': the run stops at the last complete round")

    def _check_fraction(self, rnd: int) -> None:
        n = len(self.clients)
        ok = n - len(self._failed)
        if ok < self.failure_cfg.min_fraction * n or ok == 0:
            first = next(iter(self._failed.values()))
            raise RoundFailed(f"round {rnd}: only {ok} of {n} clients finished it (failures.min_fraction = "
                              f"{self.failure_cfg.min_fraction}), so it is not committed and the run stops at the last "
                              f"complete round; every failure is in the log above, the first: client {first.client} "
                              f"in {first.step}: {first.reason}")

    # ----------------------------------------------------------------- rounds
    def train_round(self, rnd: int) -> dict[str, int]:
        """Run the algorithm's plan for round ``rnd`` >= 1; returns the bytes moved per client.

        Raises:
            RoundFailed: fewer than ``failures.min_fraction`` of the clients finished the round.
            ClientFailed: a client failed and ``failures.on_error`` is 'abort'.
        """
        self._begin_round()
        ids = [c.id for c in self.clients if faults.find(self.faults, rnd, c.id, "round") != "drop"]
        result: Optional[ServerResult] = None
        comm = {"upload_bytes_per_client": 0, "download_bytes_per_client": 0}
        for step in self.algorithm.plan(rnd):
            active = [i for i in ids if i not in self._failed]
            served = [i for i in active if result is not None and i in result.targets]
            if isinstance(step, LocalFit):
                self.local_fit(rnd, step.epochs, active)
            elif isinstance(step, Upload):
                uploads, comm["upload_bytes_per_client"] = self.upload(rnd, step.kind, active)
                if not uploads:
                    self._check_fraction(rnd)
                    raise RoundFailed(f"round {rnd}: no client sent a valid upload; the run stops at the last "
                                      "complete round (see the reasons above)")
                result = self.algorithm.server_step(rnd, uploads)
                comm["download_bytes_per_client"] = result.download_bytes
                self.stage_losses.setdefault(rnd, {}).update(result.losses)
                self._write_clusters()
            elif isinstance(step, (Distill, JointFit, UnionFit)):  # training on the server's targets (client_steps)
                self._train(rnd, served, step, result.targets)
            elif isinstance(step, LoadWeights):
                for i, got in self._client_load_weights(rnd, {i: result.targets[i] for i in served}).items():
                    if isinstance(got, TaskFailure):
                        self._fail(rnd, i, got.step or "load weights", got.reason)
            else:  # pragma: no cover - a new step kind without runner support
                raise TypeError(f"unknown client step {step!r}")
        self._settle_losses(rnd)
        self._check_fraction(rnd)
        return comm

    def _write_clusters(self) -> None:
        info = self.algorithm.clustering_info()
        if info is None:
            return
        groups = self.fed.partition.groups
        ari = None
        if groups is not None:
            ari = float(adjusted_rand_score(groups, info["assignment"]))
        info = {**info, "true_groups": None if groups is None else [int(g) for g in groups],
                "adjusted_rand_index": ari}  # for reporting only: no algorithm reads true groups (pitfall 3)
        changed = info["assignment"] != self.clusters_info.get("assignment")
        self.clusters_info = info
        self.recorder.write_json("clusters.json", info)
        if ari is not None and changed:
            self.console.print(f"clusters: K = {info['K']}, adjusted Rand index vs true groups = {ari:.4f}")

    # ----------------------------------------------------------------- evaluation
    def evaluate(self, rnd: int, phase: str, comm: Optional[dict[str, int]] = None) -> dict[str, Any]:
        """Score every client on its own test set; record and return the round's row.

        A client with an empty test (or validation) set has an undefined (NaN) accuracy, never 0; the means
        and SEMs over clients skip undefined values, and ``personalized_acc_clients`` counts the clients
        averaged into the headline.
        """
        scores = self._client_scores(rnd)
        per_client = []
        for c in self.clients:
            test, val = scores[(c.id, "test")], scores.get((c.id, "val"))
            teacher, own = test.get("teacher", {}), test["client"]
            cluster = self.algorithm.cluster_of(c.id)
            failure = self._failed.get(c.id)
            row = {"round": rnd, "client": c.id, "backbone": c.backbone, "cluster": -1 if cluster is None else cluster,
                   "teacher_acc": teacher.get("top1"), "client_acc": own["top1"],
                   "failed_step": failure.step if failure else "", "failure": failure.reason if failure else ""}
            if "top5" in own:
                row.update(teacher_top5=teacher.get("top5"), client_top5=own["top5"])
            if val is not None:  # the validation split: what settings are chosen on (never the test split)
                row.update(teacher_val_acc=val.get("teacher", {}).get("top1"), client_val_acc=val["client"]["top1"])
            per_client.append(row)
        info = self.algorithm.clustering_info() if rnd > 0 else None
        row: dict[str, Any] = {"round": rnd, "phase": phase, "num_clusters": info["K"] if info else None}
        covered = {}
        for key in _ACC_KEYS:
            if key in per_client[0]:
                stats = mean_sem([r[key] for r in per_client])  # skips None and NaN (no test samples)
                row[f"{key}_mean"], row[f"{key}_sem"] = (stats["mean"], stats["sem"]) if stats["n"] else (None, None)
                covered[key] = stats["n"]
        row.update(comm or {"upload_bytes_per_client": 0, "download_bytes_per_client": 0})
        row["failed_clients"] = len(self._failed)
        scored = "teacher" if self.algorithm.scored == "teacher" and row["teacher_acc_mean"] is not None else "client"
        row["personalized_acc_mean"], row["personalized_acc_sem"] = row[f"{scored}_acc_mean"], row[f"{scored}_acc_sem"]
        row["personalized_acc_clients"] = covered[f"{scored}_acc"]
        if f"{scored}_val_acc_mean" in row:
            row["personalized_val_acc_mean"] = row[f"{scored}_val_acc_mean"]
            row["personalized_val_acc_sem"] = row[f"{scored}_val_acc_sem"]
        if f"{scored}_top5_mean" in row:  # M >= 20: the top-5 headline (the paper's metric for Tiny ImageNet)
            row["personalized_top5_mean"] = row[f"{scored}_top5_mean"]
            row["personalized_top5_sem"] = row[f"{scored}_top5_sem"]
        row.update(self.stage_losses.get(rnd, {}))
        self.recorder.add_round(row, per_client)
        teacher, client = ("-" if row[k] is None else f"{row[k]:.4f}" for k in ("teacher_acc_mean", "client_acc_mean"))
        n = len(per_client)
        note = "" if covered[f"{scored}_acc"] == n else \
            f" (mean over {covered[f'{scored}_acc']} of {n} clients; the others have no test samples)"
        self.console.print(f"round {rnd} ({phase}): teacher h_pi(i) {teacher}  client f_i {client}{note}")
        return row

    # ----------------------------------------------------------------- the run
    def run(self, round0_cache: Optional[Path] = None, round0_key: str = "",
            resume: Optional[dict[str, Any]] = None) -> dict[str, Any]:
        """Round 0 and rounds 1..R, a checkpoint after each; returns the summary (also written to summary.json).
        ``round0_cache`` and ``round0_key``: see :meth:`pretrain`. ``resume``: a checkpoint
        (:func:`cosmos_pl.federated.checkpoint.load_latest`) to continue from, after its round.

        Raises:
            cosmos_pl.signals.Interrupted: a SIGTERM/SIGINT arrived (with :func:`cosmos_pl.signals.install`); also
                when its own exception was lost, or another one escaped while it was recorded. The round it
                interrupted is not checkpointed and no summary is written."""
        start = time.perf_counter()
        try:
            if resume is None:
                self.pretrain(round0_cache, round0_key)
                self.evaluate(0, "local-only")
                self.round_seconds[0] = time.perf_counter() - start
                self._checkpoint(0, start)
                first = 1
            else:
                self.load_state_dict(resume)
                first = int(resume["round"]) + 1
                self.console.print(f"resumed after round {first - 1} from {self.last_checkpoint}")
            for rnd in range(first, self.rounds + 1):
                round_start = time.perf_counter()
                comm = self.train_round(rnd)
                self.evaluate(rnd, self.algorithm.phase(rnd), comm)
                self.round_seconds[rnd] = time.perf_counter() - round_start
                self._checkpoint(rnd, start)
        except BaseException as err:  # a SIGTERM/SIGINT whose exception was lost ends as Interrupted all the same
            signals.check(err)
            raise
        finally:
            self.executor.close()
        signals.check()  # a stopped run is not reported as finished
        summary = self.summary(self.previous_wall + time.perf_counter() - start)
        self.recorder.write_summary(summary)
        return summary

    # ----------------------------------------------------------------- checkpoints
    def _checkpoint(self, rnd: int, start: float) -> None:
        run_dir = self.recorder.run_dir
        if run_dir is None:
            return
        signals.check()  # a round that a stop request interrupted is never committed
        state = self.state_dict()
        state["runner"]["wall"] = self.previous_wall + time.perf_counter() - start
        self.last_checkpoint = checkpoint.save(run_dir.path, rnd, state, self.checkpoint_cfg.keep)

    def state_dict(self) -> dict[str, Any]:
        """Everything a resumed run needs after the last evaluated round (tensors and plain values only)."""
        return {
            **self.checkpoint_meta,
            "clients": [c.model.state_dict() for c in self.clients],
            "algorithm": self.algorithm.state_dict(),
            "records": self.recorder.state_dict(),
            "runner": {"clusters_info": self.clusters_info,
                       "round_seconds": {str(k): v for k, v in self.round_seconds.items()},
                       "stage_seconds": dict(self.timer.seconds), "stage_seconds_by_round": dict(self.timer.by_round),
                       "failures": [f.as_dict() for f in self.failures]},
            "rng": checkpoint.capture_rng(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` into this freshly built runner (same config, hence same models)."""
        if len(state["clients"]) != len(self.clients):
            raise ConfigError(f"this checkpoint holds {len(state['clients'])} client models for {len(self.clients)} "
                              "clients: a run over Flower keeps the client models on the nodes, so it cannot be "
                              "resumed in-process; start it again")
        for c, weights in zip(self.clients, state["clients"]):
            c.model.load_state_dict(weights)
        self.algorithm.load_state_dict(state["algorithm"])
        self.recorder.load_state_dict(state["records"])
        r = state["runner"]
        self.clusters_info = dict(r["clusters_info"])
        if self.clusters_info:
            self.recorder.write_json("clusters.json", self.clusters_info)
        self.round_seconds = {int(k): v for k, v in r["round_seconds"].items()}
        self.timer.seconds, self.timer.by_round = dict(r["stage_seconds"]), dict(r["stage_seconds_by_round"])
        self.failures = [Failure(**f) for f in r["failures"]]
        self.previous_wall = float(r.get("wall", 0.0))
        checkpoint.restore_rng(state["rng"])  # last: building the models above drew from the global generators

    def summary(self, wall: float) -> dict[str, Any]:
        """The headline (final round), the best round, round 0, clusters, communication and timings."""
        rows = self.recorder.rows

        def entry(row: dict[str, Any]) -> dict[str, Any]:
            out = {"round": row["round"]}
            for key in ("personalized_acc", "personalized_top5", "personalized_val_acc", *_ACC_KEYS):
                if f"{key}_mean" in row:
                    out[key] = {"mean": row[f"{key}_mean"], "sem": row[f"{key}_sem"]}
            out["personalized_acc"]["clients"] = row.get("personalized_acc_clients")  # clients with a defined accuracy
            return out

        federated = rows[1:]
        headline = "personalized_top5_mean" if self.headline_metric == "top5" else "personalized_acc_mean"
        best = max(federated, key=lambda r: (-math.inf if r.get(headline) is None else r[headline], -r["round"]))
        scored = "cluster teacher h_pi(i)" if self.algorithm.scored == "teacher" else "client model f_i"
        info = self.clusters_info
        up = [r["upload_bytes_per_client"] for r in federated]
        down = [r["download_bytes_per_client"] for r in federated]
        return {
            "algorithm": self.algorithm.name,
            "scored_model": scored,
            "headline": f"final round, mean personalized {METRIC_LABEL[self.headline_metric]} accuracy of the "
                        f"{scored} over clients",
            "headline_metric": self.headline_metric,
            "final": entry(rows[-1]),
            "best": {**entry(best), "note": "round with the highest mean personalized accuracy; reported beside "
                                            "final, never used to select anything"},
            "local_only": {"round": 0, **{key: {"mean": rows[0][f"{key}_mean"], "sem": rows[0][f"{key}_sem"]}
                                          for key in ("client_acc", "client_top5") if f"{key}_mean" in rows[0]}},
            "clusters": {"K": info.get("K"), "b0": info.get("b0"), "assignment": info.get("assignment"),
                         "adjusted_rand_index": info.get("adjusted_rand_index")},
            "communication": {
                "upload_bytes_per_client_per_round": max(up), "download_bytes_per_client_per_round": max(down),
                "upload_bytes_per_client_total": sum(up), "download_bytes_per_client_total": sum(down),
                "upload_dtype": self.comm.upload_dtype, "top_k": self.comm.top_k, "rounds": self.rounds,
                "public_samples": len(self.public), "num_classes": self.fed.num_classes,
                "parameter_bytes_per_client": [count_parameters(c.model) * 4 for c in self.clients],
            },
            "num_clients": len(self.clients),
            "failures": [f.as_dict() for f in self.failures],
            "backbones": {"clients": [c.backbone for c in self.clients],
                          "teacher": getattr(self.algorithm, "teacher_backbone", None)},
            "wall_seconds": round(wall, 2),
            "stage_seconds": {k: round(v, 2) for k, v in self.timer.seconds.items()},
            "round_seconds": {str(k): round(v, 2) for k, v in self.round_seconds.items()},
            "stage_seconds_by_round": {r: {k: round(v, 2) for k, v in st.items()} for r, st in self.timer.by_round.items()},
        }

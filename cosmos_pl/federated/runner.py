"""The one round loop every algorithm runs on, over any transport.

Round 0: every client trains E0 epochs on its own data (the local-only baseline). Rounds 1..R: the algorithm's plan,
step by step (local fit, upload and the server step, distill, joint or union fit, load weights); at the end of each
evaluated round every client scores its own f_i and the models the algorithm names for it (COSMOS: its teacher
h_pi(i)) on its own test set, and the rows, then the round checkpoint, are written. The server side holds U, the
class list and what the clients report about themselves; the clients are behind
:class:`~cosmos_pl.federated.clients.Clients` (in-process, or Flower nodes), built from a
:class:`~cosmos_pl.federated.server_view.ServerView` (what they may know of the server, never the runner). The runner
owns the executor, the upload checks (:mod:`~cosmos_pl.federated.received`), the failure policy
(:mod:`~cosmos_pl.federated.round_state`), the records and the checkpoints; an algorithm owns only its server step and
its state.
"""

from __future__ import annotations

import contextlib
import functools
import time
from pathlib import Path
from typing import Any, Callable, Optional

import torch
from rich.console import Console
from torch import nn

from cosmos_pl import signals
from cosmos_pl.algorithms.base import Algorithm, FederationContext, ServerResult
from cosmos_pl.data import Federation
from cosmos_pl.errors import ConfigError
from cosmos_pl.runs import checkpoint
from cosmos_pl.runs.checkpoint import capture_rng, restore_rng
from cosmos_pl.federated.clients import Clients
from cosmos_pl.federated.evaluation import (RoundOutcome, RunRecord, round_line, round_rows, structure_columns,
                                            summarize_run, with_adjusted_rand_index)
from cosmos_pl.execution.executor import Executor
from cosmos_pl.execution.task_failure import TaskFailure
from cosmos_pl.federated.failures import Failure, RoundFailed
from cosmos_pl.federated.in_process import InProcessClients
from cosmos_pl.federated.initial_models import seeded_backbone
from cosmos_pl.federated.received import accept_uploads
from cosmos_pl.runs.recorder import Recorder
from cosmos_pl.federated.round_state import RoundState
from cosmos_pl.federated.sampling import sampled_clients
from cosmos_pl.federated.server_data import ServerData
from cosmos_pl.federated.server_view import ServerView
from cosmos_pl.federated.settings import RunSettings
from cosmos_pl.execution.tasks import TaskRunner
from cosmos_pl.models import check_backbones
from cosmos_pl.models.personal import shared_weights
from cosmos_pl.objectives.protocol import LoadWeights, Upload
from cosmos_pl.objectives.runtime import ClientRuntime
from cosmos_pl.objectives.step import ClientStep
from cosmos_pl.report import log_console
from cosmos_pl.training.client import ClientConfig
from cosmos_pl.training.config import stage_seed
from cosmos_pl.uploads import UploadSpec, public_fingerprint

__all__ = ["Runner", "RunSettings", "ServerData"]


class Runner:
    """Runs one algorithm: round 0, then ``settings.rounds`` rounds of the algorithm's plan, over ``transport``'s
    clients.

    Args:
        federation: a simulation's federation (its clients are then in-process), or with a ``transport`` the
            server's data alone (:class:`ServerData`: U and the class list).
        algorithm: the method; checked against the clients' backbones (:meth:`Algorithm.validate`) and set up
            (:meth:`Algorithm.setup`) once the clients are known.
        clients: the clients' settings (backbones, epochs, optimizers).
        settings: the rounds, seed, sampling, evaluation and the sections' settings (:class:`RunSettings`).
        recorder: the run's records (default: kept in memory only).
        console: where lines are printed (default: :func:`cosmos_pl.report.log_console`).
        checkpoint_meta: plain values every checkpoint holds beside the state (config hash, W&B run id).
        transport: ``(view) -> Clients``, the clients over another transport (Flower), built from a
            :class:`~cosmos_pl.federated.server_view.ServerView`; default in-process
            (:meth:`~cosmos_pl.federated.in_process.InProcessClients.build`).
        device: what the stages train on (:func:`cosmos_pl.training.cuda_check.describe_device`), kept in
            summary.json as ``device``; None: not recorded.

    Raises:
        ValueError: bad settings, or a federation the algorithm cannot run (naming the field and the fix).
        ConfigError: a client's or the server's backbone cannot take the images (a dry forward pass of each
            distinct backbone before any model is trained, :func:`cosmos_pl.models.check_backbones`), or the
            clients' backbones cannot run the algorithm.
    """

    def __init__(self, federation: Federation | ServerData, algorithm: Algorithm, clients: ClientConfig,
                 settings: RunSettings, *, recorder: Optional[Recorder] = None, console: Optional[Console] = None,
                 checkpoint_meta: Optional[dict[str, Any]] = None,
                 transport: Optional[Callable[[ServerView], Clients]] = None,
                 device: Optional[dict[str, Any]] = None) -> None:
        if settings.rounds < 1:
            raise ValueError(f"rounds={settings.rounds}: at least 1 communication round is needed")
        if not clients.backbones:
            raise ValueError("clients.backbones is empty: give at least one timm/torchvision name")
        self.server = federation if isinstance(federation, ServerData) else \
            ServerData(federation.public, list(federation.classes))
        self.algorithm, self.client_config, self.rounds, self.seed = algorithm, clients, settings.rounds, settings.seed
        self.trainer, self.comm = settings.trainer, settings.communication
        self.recorder, self.console = recorder or Recorder(), console or log_console()
        self.failure_cfg, self.checkpoint_cfg = settings.failures, settings.checkpoints
        self.checkpoint_meta, self.headline_metric = dict(checkpoint_meta or {}), settings.headline_metric
        self.evaluate_every, self.clients_per_round = settings.evaluate_every, settings.clients_per_round
        self.device = device  # what the stages train on (fit's first line), kept in summary.json
        self.taking_part: Optional[list[int]] = None  # this round's sampled clients (None: every client)
        self.executor = Executor(settings.executor, self.trainer.accelerator)
        self.run_tasks = TaskRunner(self.executor, self.console, self.failure_cfg.timeout_s)
        self.public, self.round_seconds, self.clusters_info = self.server.public, {}, {}
        self.executor.keep_resident("public", self.public)  # sent to each worker once, kept there (and one GPU copy)
        self.fingerprint = public_fingerprint(self.public)
        self.last_checkpoint: Optional[Path] = None
        self.previous_wall = 0.0  # seconds spent before a resume
        self.extra_bytes: dict[str, list[int]] = {"evaluation": [], "setup": []}
        self._references: dict[str, dict[str, torch.Tensor]] = {}  # backbone name -> reference (see reference)
        check_backbones({**{f"clients.backbones[{j}]": name for j, name in enumerate(clients.backbones)},
                         **algorithm.server_backbones()},
                        self.server.num_classes, (self.server.in_chans, *self.server.image_shape))
        self.runtime = ClientRuntime(settings.seed, clients, settings.transformations, self.trainer, self.public,
                                     self.server.num_classes)
        if transport is None:
            transport = functools.partial(InProcessClients.build, federation=federation, executor=self.executor,
                                          algorithm=algorithm, server_model_bytes=lambda: self._server_model_bytes)
        view = ServerView(self.server, self.fingerprint, self.comm, self.runtime, self.rounds,
                          self.failure_cfg.timeout_s, self.console, self.recorder, self.run_tasks, self.reference,
                          self._report_losses)
        self.clients = transport(view)  # a deployment's clients have joined and described themselves
        self.state = RoundState(self.failure_cfg, len(self.clients.infos), self.clients.fail, self.console.print)
        try:
            self._setup_algorithm()
        except BaseException:  # clients the algorithm cannot run: their workers or nodes are let go
            self._close()
            raise

    def _setup_algorithm(self) -> None:
        """Check the clients' backbones against the algorithm (the one place for every transport: the clients have
        described themselves by now), then set it up with what it may know of the federation."""
        infos = self.clients.infos
        self.algorithm.validate([c.backbone for c in infos])
        self.algorithm.setup(FederationContext(
            num_clients=len(infos), num_classes=self.server.num_classes, public=self.public,
            backbones=[c.backbone for c in infos], client_sizes=[c.train_size for c in infos], seed=self.seed,
            stage_seed=lambda rnd, stage, i: stage_seed(self.seed, rnd, stage, i), make_backbone=self.make_backbone,
            run_tasks=self.run_tasks, trainer=self.trainer, transformations=self.runtime.transformations,
            local_epochs=self.client_config.local_epochs, distill_epochs=self.client_config.distill_epochs,
            log=self._algorithm_log))

    @functools.cached_property
    def _server_model_bytes(self) -> int:
        """float32 bytes of the largest server-side model (a teacher), 0 for an algorithm without one; built once
        (the in-process clients size the workers and check /dev/shm with it)."""
        names = set(self.algorithm.server_backbones().values())
        if not names:
            return 0
        with torch.random.fork_rng(devices=[]):  # CPU only: no CUDA context in this process
            return max(sum(t.numel() * t.element_size() for t in self.make_backbone(n, 0).state_dict().values())
                       for n in names)

    def make_backbone(self, name: str, seed: int) -> nn.Module:
        """A Kaiming-initialized backbone for the server's images, created under ``torch.manual_seed(seed)``
        (:func:`~cosmos_pl.federated.initial_models.seeded_backbone`)."""
        return seeded_backbone(name, seed, self.server.num_classes, self.server.in_chans, self.server.image_shape)

    def reference(self, client: int) -> dict[str, torch.Tensor]:
        """The float tensors a client's weights must match: the server's own copy of its reported architecture (its
        random draws kept apart from the run's). Built once per architecture and shared: only its keys, shapes and
        dtypes are read, and building a backbone per client and round is a cost the server need not pay
        (docs/performance.md, "The server's reference weights")."""
        name = self.clients.infos[client].backbone
        if name not in self._references:
            with torch.random.fork_rng(devices=[]):  # CPU only: no CUDA context in this process
                self._references[name] = shared_weights(self.algorithm.client_model(self.make_backbone(name, 0)))
        return self._references[name]

    # ----------------------------------------------------------------- rounds
    def pretrain(self, cache: Optional[Path] = None, key: str = "") -> None:
        """Round 0: E0 local epochs for every client (in-process: from the round-0 cache where it holds them)."""
        self.state.begin()
        self.clients.begin_round(0)
        from cosmos_pl.objectives.local_fit import LocalFit  # Lightning: imported where training starts

        self.state.record(0, LocalFit.stage, self.clients.pretrain(self.client_config.pretrain_epochs, cache, key))
        cached = self.clients.round0_losses()
        if cached is not None:
            self.state.stage_losses[0] = cached
        try:
            self.state.check_fraction(0)
        finally:  # the round-0 models are shared (in-process: cached) only when every client finished it
            self.clients.pretrained(None if self.state.failed else self.state.stage_losses.get(0, {}))

    def pretrain_only(self, cache: Optional[Path], key: str) -> None:
        """Round 0 alone, into the round-0 cache ``cache`` under ``key`` (see :meth:`pretrain`), then the clients
        and the executor closed: ``fit --round0_only``, the round-0 jobs of ``compare --launcher slurm``."""
        try:
            self.pretrain(cache, key)
        finally:
            self._close()

    def train_round(self, rnd: int) -> dict[str, int]:
        """Run the algorithm's plan for round ``rnd`` >= 1; returns the bytes moved per client.

        Raises:
            RoundFailed: fewer than ``failures.min_fraction`` of the clients finished the round.
            ClientFailed: a client failed and ``failures.on_error`` is 'abort'.
        """
        sampled = sampled_clients(len(self.clients.infos), self.clients_per_round, self.seed, rnd)
        self.taking_part = None if self.clients_per_round is None else sampled
        self.state.begin(len(sampled))
        self.clients.begin_round(rnd)
        result: Optional[ServerResult] = None
        comm = {"upload_bytes_per_client": 0, "download_bytes_per_client": 0}
        if self.clients_per_round is not None:  # bytes per client are those of a client that took part
            comm["clients_in_round"] = len(sampled)
        for step in self.algorithm.plan(rnd):
            active = [i for i in sampled if i not in self.state.failed]
            served = [i for i in active if result is not None and i in result.targets]
            if isinstance(step, ClientStep) and not step.needs_target:  # local training, Ditto's personal step
                if not step.idle() and active:
                    self.state.record(rnd, step.stage, self.clients.train(rnd, step, active, {}))
            elif isinstance(step, Upload):
                hard = step.kind == "hard"
                spec = UploadSpec(len(self.public), self.server.num_classes, "index" if hard else
                                  self.comm.upload_dtype, None if hard else self.comm.top_k, self.fingerprint)
                got = self.clients.upload(rnd, step.kind, active) if active else {}
                uploads, comm["upload_bytes_per_client"] = accept_uploads(rnd, step.kind, got, spec, self.reference,
                                                                          self.state.fail, self.algorithm.upload_bytes)
                if not uploads:
                    self.state.check_fraction(rnd)
                    raise RoundFailed(f"round {rnd}: no client sent a valid upload; the run stops at the last "
                                      "complete round (see the reasons above)")
                result = self.algorithm.server_step(rnd, uploads)
                comm["download_bytes_per_client"] = result.download_bytes
                self.state.stage_losses.setdefault(rnd, {}).update(result.losses)
                self._write_clusters()
            elif isinstance(step, ClientStep):  # training on the server's targets (its behaviour: the step's own)
                if served:
                    self.state.record(rnd, step.stage, self.clients.train(rnd, step, served, result.targets))
            elif isinstance(step, LoadWeights):  # who loads them is the algorithm's rule (weight_receivers)
                loading = [] if result is None else self.algorithm.weight_receivers(served, sampled, result.targets)
                for i, got in self.clients.load_weights(rnd, {i: result.targets[i] for i in loading}).items():
                    if isinstance(got, TaskFailure):
                        self.state.fail(rnd, i, got.step or "load weights", got.reason)
            else:  # pragma: no cover - a new step kind without runner support
                raise TypeError(f"unknown client step {step!r}")
        self.state.settle(rnd)
        self.state.check_fraction(rnd)
        return comm

    def _report_losses(self, rnd: int, losses: list[tuple[str, int, dict[str, float]]]) -> None:
        """Steps' last-epoch losses that a transport received after the steps (:attr:`ServerView.report_losses`)."""
        for stage, client, parts in losses:
            self.state.keep(stage, client, parts)
        self.state.settle(rnd)

    def _algorithm_log(self, line: str) -> None:
        # one line each (the terminal may wrap it, rich does not): a warning stays one line for grep and log tools
        self.console.print(line, soft_wrap=True)

    def _write_clusters(self) -> None:
        info = self.algorithm.clustering_info()
        if info is None:
            return
        facts = self.clients.simulation()  # true groups: a simulation's, for reporting only (no algorithm reads them)
        info = with_adjusted_rand_index(info, None if facts is None else facts.groups)
        changed = info["assignment"] != self.clusters_info.get("assignment")
        self.clusters_info = info
        self.recorder.write_json("clusters.json", info)
        if info["adjusted_rand_index"] is not None and changed:
            self.console.print(f"clusters: K = {info['K']}, adjusted Rand index vs true groups = "
                               f"{info['adjusted_rand_index']:.4f}")

    def evaluate(self, rnd: int, phase: str, comm: Optional[dict[str, int]] = None) -> dict[str, Any]:
        """End the round on every client (each scoring its models on its own splits when the round is evaluated);
        record and return the round's row (:func:`cosmos_pl.federated.evaluation.round_rows`)."""
        every = self.evaluate_every
        evaluated = rnd in (0, self.rounds) or (every != "final" and rnd % every == 0)
        infos = self.clients.infos
        scores, failed = self.clients.end_round(rnd, {c.id: self.algorithm.eval_models(c.id) for c in infos},
                                                evaluate=evaluated)
        for i, failure in failed.items():  # a step that rode on the end of the round, a lost node
            self.state.fail(rnd, i, failure.step or "evaluation", failure.reason)
        self.state.settle(rnd)
        if failed:
            self.state.check_fraction(rnd)
        for kind, value in self.clients.bytes(rnd).items():
            self.extra_bytes[kind].append(value)
        # the clustering as the server step left it (_write_clusters; a resume restores it): it changes only there
        info = (self.clusters_info or None) if rnd > 0 else None
        outcome = RoundOutcome(
            rnd=rnd, phase=phase, scores=scores, clusters={c.id: self.algorithm.cluster_of(c.id) for c in infos},
            failed=self.state.failed, num_clusters=info["K"] if info else None,
            comm=comm or {"upload_bytes_per_client": 0, "download_bytes_per_client": 0},
            losses=self.state.stage_losses.get(rnd, {}))
        row, per_client = round_rows(outcome, infos, self.algorithm.scored)
        if self.clients_per_round is not None:  # which clients trained and uploaded this round (round 0: all)
            for r in per_client:
                r["took_part"] = rnd == 0 or r["client"] in (self.taking_part or [])
        row.update(structure_columns(info))
        self.recorder.add_round(row, per_client)
        self.console.print(round_line(row, len(per_client)))
        return row

    # ----------------------------------------------------------------- the run
    def run(self, round0_cache: Optional[Path] = None, round0_key: str = "",
            resume: Optional[dict[str, Any]] = None) -> dict[str, Any]:
        """Round 0 and rounds 1..R, a checkpoint after each; returns the summary (also written to summary.json).
        ``round0_cache`` and ``round0_key``: see :meth:`pretrain`. ``resume``: a checkpoint
        (:func:`cosmos_pl.runs.checkpoint.load_latest`) to continue from, after its round.

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
            self._close()
        signals.check()  # a stopped run is not reported as finished
        summary = self.summary(self.previous_wall + time.perf_counter() - start)
        self.recorder.write_summary(summary)
        return summary

    def _close(self) -> None:
        """The clients (their failure to close does not hide the run's own outcome), then the executor."""
        with contextlib.suppress(Exception):
            self.clients.close()
        self.executor.close()

    def summary(self, wall: float) -> dict[str, Any]:
        """The headline, the best round, round 0, clusters, communication and timings (:func:`summarize_run`), and
        the device the stages trained on where it was given, with the executor's workers and threads per task."""
        record = RunRecord(
            rows=self.recorder.rows, infos=self.clients.infos, failures=self.state.failures,
            clusters_info=self.clusters_info, extra_bytes=self.extra_bytes, round_seconds=self.round_seconds,
            timer=self.run_tasks.timer, wall=wall, rounds=self.rounds, public_samples=len(self.public),
            num_classes=self.server.num_classes)
        summary = summarize_run(record, self.algorithm, self.headline_metric, self.comm)
        if self.device is not None:  # with the executor's final choice: parallel workers (0: in this process)
            ex = self.executor
            summary["device"] = {**self.device, "workers": len(ex.slots) if ex.parallel else 0,
                                 "threads_per_task": ex.threads}
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
        """Everything a resumed run needs after its last evaluated round: the checkpoint's plain values (config
        hash, W&B run id), the clients' state (in-process: their models), the algorithm's, the records so far, the
        global random states, and under ``"runner"`` its clusters, extra bytes, timers and failures. These keys are
        those of every round checkpoint (:mod:`~cosmos_pl.runs.checkpoint`, format 1)."""
        timer = self.run_tasks.timer
        return {**self.checkpoint_meta, "clients": self.clients.state_dict(),
                "algorithm": self.algorithm.state_dict(), "records": self.recorder.state_dict(), "rng": capture_rng(),
                "runner": {"clusters_info": self.clusters_info, "extra_bytes": self.extra_bytes,
                           "round_seconds": {str(k): v for k, v in self.round_seconds.items()},
                           "stage_seconds": dict(timer.seconds), "stage_seconds_by_round": dict(timer.by_round),
                           "failures": [f.as_dict() for f in self.state.failures]}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` into this freshly built runner of the same config (hence the same models);
        ``state["runner"]["wall"]``, where present, is the seconds the run spent before.

        Raises:
            ConfigError: the checkpoint does not hold this run's clients (a run over Flower keeps its clients'
                models on the nodes: it is not resumed in-process).
        """
        if len(state["clients"].get("models", [])) != len(self.clients.infos):
            raise ConfigError("this checkpoint does not hold this run's client models (a run over Flower keeps them "
                              "on the nodes, so it cannot be resumed in-process); start it again")
        self.clients.load_state_dict(state["clients"])
        self.algorithm.load_state_dict(state["algorithm"])
        self.recorder.load_state_dict(state["records"])
        r = state["runner"]
        self.clusters_info = dict(r["clusters_info"])
        if self.clusters_info:
            self.recorder.write_json("clusters.json", self.clusters_info)
        self.round_seconds = {int(k): v for k, v in r["round_seconds"].items()}
        self.run_tasks.timer.seconds = dict(r["stage_seconds"])
        self.run_tasks.timer.by_round = dict(r["stage_seconds_by_round"])
        self.state.failures = [Failure(**f) for f in r["failures"]]
        self.extra_bytes = {k: list(v) for k, v in r["extra_bytes"].items()}
        self.previous_wall = float(r.get("wall", 0.0))
        restore_rng(state["rng"])  # last: building the models drew from the global generators

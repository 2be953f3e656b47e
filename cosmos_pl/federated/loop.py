"""The COSMOS round logic: PTC phase (round 1) then IFFT rounds (COSMOS paper, Sections 4.1-4.2).

Round 0: every client trains E0 epochs on its labelled data (local-only baseline).
Round 1 (PTC): clients upload pseudo-labels on U; the server clusters them once (Algorithm 1), averages
each cluster's pseudo-labels, trains one teacher per cluster from scratch (Eq. 1) and sends each client
its teacher's pseudo-labels, which the client distills (Eq. 2).
Rounds 2.. (IFFT): local fine-tune, upload, teacher fine-tune on the new cluster aggregate, client distill.
After every round each client is scored on its own test set, with its cluster teacher h_pi(i) (the
headline) and with its own model f_i.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from sklearn.metrics import adjusted_rand_score
from torch import nn

from cosmos_pl.clustering import greedy_clustering, pairwise_distances, resolve_b0
from cosmos_pl.communication import decode, encode, pseudo_label_bytes
from cosmos_pl.config import ClientConfig, CommunicationConfig, CosmosConfig, ServerConfig
from cosmos_pl.data import ClientData, Federation
from cosmos_pl.federated.records import RunDirectory
from cosmos_pl.federated.executor import Executor, ExecutorConfig, Task
from cosmos_pl.federated.stages import (
    TrainerConfig,
    evaluate_client,
    fit_distillation,
    fit_supervised,
    predict_probs,
    stage_seed,
    teacher_stage,
)
from cosmos_pl.losses import apply_temperature
from cosmos_pl.models import create_backbone
from cosmos_pl.report import mean_sem
from cosmos_pl.tracking import Tracker

__all__ = ["FederatedLoop", "Client"]


@dataclass
class Client:
    """One client: its id, architecture name, model f_i and private data D_i (kept in memory, pitfall 11)."""

    id: int
    backbone: str
    model: nn.Module
    data: ClientData
    cluster: int = -1


@dataclass
class _Timer:
    """Seconds per stage, in total and per round; labels look like "round 2: local training"."""

    seconds: dict[str, float] = field(default_factory=dict)
    by_round: dict[str, dict[str, float]] = field(default_factory=dict)

    def add(self, label: str, start: float) -> None:
        rnd, stage = label.removeprefix("round ").split(": ", 1)
        elapsed = time.perf_counter() - start
        self.seconds[stage] = self.seconds.get(stage, 0.0) + elapsed
        per = self.by_round.setdefault(rnd, {})
        per[stage] = per.get(stage, 0.0) + elapsed


class FederatedLoop:
    """Coordinates one Lightning Trainer per stage over all clients and cluster teachers.

    Args:
        federation: clients' data, the public set U ``[n, C, H, W]`` (inputs only) and the partition.
        clients: client settings; server: server settings; cosmos: algorithm settings; trainer: devices/precision.
        executor: where independent tasks run (default: sequential in this process).
        communication: how uploads are encoded (default: dense float32).
        seed: the experiment seed; every stage is seeded from (seed, round, stage, id).
        run_dir: where metrics.csv, clients.csv, clusters.json and summary.json go.
        tracker: the W&B run; console: where progress and the table are printed.
    """

    def __init__(self, federation: Federation, clients: ClientConfig, server: ServerConfig, cosmos: CosmosConfig,
                 trainer: TrainerConfig, seed: int, run_dir: RunDirectory, tracker: Tracker,
                 console: Console | None = None, executor: ExecutorConfig | None = None,
                 communication: CommunicationConfig | None = None) -> None:
        if cosmos.rounds < 1:
            raise ValueError(f"cosmos.rounds={cosmos.rounds}: at least 1 (the PTC round) is needed")
        if not clients.backbones:
            raise ValueError("clients.backbones is empty: give at least one timm/torchvision name")
        if not isinstance(server.b0, str):
            resolve_b0(server.b0, np.zeros((1, 1)))  # a bad number fails now, not after round 0 has trained
        self.fed, self.ccfg, self.scfg, self.cosmos, self.tcfg = federation, clients, server, cosmos, trainer
        self.seed, self.run_dir, self.tracker = seed, run_dir, tracker
        self.console = console or Console()
        self.timer = _Timer()
        self.round_seconds: dict[int, float] = {}
        self.executor = Executor(executor or ExecutorConfig())
        self.comm = communication or CommunicationConfig()
        self.rows: list[dict[str, Any]] = []
        self.client_rows: list[dict[str, Any]] = []
        self.clients = [self._make_client(i, d) for i, d in enumerate(federation.clients)]
        self.teachers: list[nn.Module] = []
        self.clusters: list[list[int]] = []
        self.public = federation.public_x
        n, m = len(self.public), federation.num_classes
        self.upload_bytes = pseudo_label_bytes(n, m, self.comm.upload_dtype, self.comm.top_k)
        self.download_bytes = pseudo_label_bytes(n, m)  # teachers' pseudo-labels come back dense float32

    # ----------------------------------------------------------------- construction
    def _backbone(self, name: str, role_seed: int) -> nn.Module:
        torch.manual_seed(role_seed)
        return create_backbone(name, self.fed.num_classes, self.fed.in_chans, max(self.fed.image_shape))

    def _make_client(self, i: int, data: ClientData) -> Client:
        name = self.ccfg.backbones[i % len(self.ccfg.backbones)]
        return Client(i, name, self._backbone(name, stage_seed(self.seed, 0, "init", i)), data)

    # ----------------------------------------------------------------- stages
    def _progress(self) -> Progress:
        return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        console=self.console, transient=True)

    def _run(self, label: str, tasks: list[Task], costs: list[float] | None = None,
             trains: bool = False) -> list[tuple[nn.Module, Any]]:
        """Run a stage's independent tasks on the executor; returns ``(model, output)`` in task order."""
        start = time.perf_counter()
        results: list[Any] = [None] * len(tasks)
        with self._progress() as bar:
            task = bar.add_task(label, total=len(tasks))
            for i, model, out in self.executor.map(tasks, costs, returns_model=trains):
                results[i] = (model, out)
                bar.advance(task)
        self.timer.add(label, start)
        return results

    @staticmethod
    def _cost(model: nn.Module, samples: int) -> float:
        return float(sum(p.numel() for p in model.parameters()) * samples)

    def _local_training(self, rnd: int, epochs: int) -> None:
        tasks = [(fit_supervised, dict(
            model=c.model, x=c.data.x, y=c.data.y, epochs=epochs, batch_size=self.ccfg.batch_size,
            optimizer=self.ccfg.optimizer, transformations=self.cosmos.transformations, trainer=self.tcfg,
            seed=stage_seed(self.seed, rnd, "local", c.id))) for c in self.clients]
        costs = [self._cost(c.model, len(c.data.x)) for c in self.clients]
        for c, (model, _) in zip(self.clients, self._run(f"round {rnd}: local training", tasks, costs, trains=True)):
            c.model = model

    def _upload(self, rnd: int) -> torch.Tensor:
        """Every client's pseudo-labels on U as the server decodes them: ``[N, n, M]``."""
        tasks = [(predict_probs, dict(model=c.model, x=self.public, trainer=self.tcfg)) for c in self.clients]
        costs = [self._cost(c.model, len(self.public)) for c in self.clients]
        payloads = [encode(probs, self.comm.upload_dtype, self.comm.top_k)
                    for _, probs in self._run(f"round {rnd}: pseudo-labels", tasks, costs)]
        self.upload_bytes = payloads[0].nbytes  # every client sends the same shape
        return torch.stack([decode(p) for p in payloads])

    def _cluster(self, uploads: torch.Tensor) -> dict[str, Any]:
        distances = pairwise_distances(uploads, self.scfg.distance)
        b0 = resolve_b0(self.scfg.b0, distances)
        self.clusters = greedy_clustering(distances, b0)
        for k, members in enumerate(self.clusters):
            for i in members:
                self.clients[i].cluster = k
        assignment = [c.cluster for c in self.clients]
        groups = self.fed.partition.groups
        ari = float(adjusted_rand_score(groups, assignment)) if groups is not None else None
        info = {
            "b0": b0, "b0_setting": self.scfg.b0, "distance": self.scfg.distance, "K": len(self.clusters),
            "assignment": assignment, "clusters": self.clusters,
            "true_groups": None if groups is None else [int(g) for g in groups],
            "adjusted_rand_index": ari,  # for reporting only: the algorithm never reads true groups
            "distances": distances.round(6).tolist(),
        }
        self.run_dir.write_json("clusters.json", info)
        self.console.print(f"clustering: B0={b0:.4f} ({self.scfg.b0}) -> K={len(self.clusters)} clusters "
                           f"{self.clusters}; ARI vs true groups = {ari if ari is None else round(ari, 4)}")
        return info

    def _teacher_round(self, rnd: int, uploads: torch.Tensor) -> list[torch.Tensor]:
        """Fit every cluster teacher on its aggregate (Eq. 1); return their pseudo-labels on U ``[n, M]`` each."""
        if not self.teachers:
            self.teachers = [self._backbone(self.scfg.backbone, stage_seed(self.seed, 0, "teacher_init", k))
                             for k in range(len(self.clusters))]
        ptc = rnd == 1
        optimizer = self.scfg.optimizer if ptc or self.scfg.finetune_optimizer is None else self.scfg.finetune_optimizer
        epochs = self.scfg.ptc_epochs if ptc else self.scfg.distill_epochs
        tasks = [(teacher_stage, dict(
            model=self.teachers[k], cluster_labels=uploads[members], aggregation=self.scfg.aggregation,
            temperature=self.cosmos.temperature, x=self.public, epochs=epochs, batch_size=self.scfg.batch_size,
            optimizer=optimizer, transformations=self.cosmos.transformations, lam=self.cosmos.lambda_,
            num_views=self.cosmos.num_views, trainer=self.tcfg, seed=stage_seed(self.seed, rnd, "teacher", k),
            target_grad=self.cosmos.consistency_target_grad)) for k, members in enumerate(self.clusters)]
        costs = [self._cost(t, len(self.public) * max(epochs, 1)) for t in self.teachers]
        results = self._run(f"round {rnd}: teacher distillation", tasks, costs, trains=True)
        self.teachers = [model for model, _ in results]
        return [labels for _, labels in results]

    def _client_distillation(self, rnd: int, teacher_labels: list[torch.Tensor]) -> None:
        tasks = [(fit_distillation, dict(
            model=c.model, x=self.public, targets=apply_temperature(teacher_labels[c.cluster], self.cosmos.temperature),
            epochs=self.ccfg.distill_epochs, batch_size=self.ccfg.batch_size, optimizer=self.ccfg.distill_optimizer,
            transformations=self.cosmos.transformations, lam=self.cosmos.lambda_, num_views=self.cosmos.num_views,
            trainer=self.tcfg, seed=stage_seed(self.seed, rnd, "distill", c.id),
            target_grad=self.cosmos.consistency_target_grad)) for c in self.clients]
        costs = [self._cost(c.model, len(self.public)) for c in self.clients]
        for c, (model, _) in zip(self.clients, self._run(f"round {rnd}: client distillation", tasks, costs, trains=True)):
            c.model = model

    # ----------------------------------------------------------------- evaluation
    def _evaluate(self, rnd: int, phase: str) -> dict[str, Any]:
        m = self.fed.num_classes
        per_client: list[dict[str, Any]] = []

        tasks = [(evaluate_client, dict(
            model=c.model, teacher=self.teachers[c.cluster] if self.teachers else None, x=c.data.x_test,
            y=c.data.y_test, num_classes=m, trainer=self.tcfg)) for c in self.clients]
        for c, (_, (own, teacher)) in zip(self.clients, self._run(f"round {rnd}: evaluation", tasks)):
            per_client.append({"round": rnd, "client": c.id, "backbone": c.backbone, "cluster": c.cluster,
                               "teacher_acc": teacher.get("top1"), "client_acc": own["top1"],
                               **({"teacher_top5": teacher.get("top5"), "client_top5": own["top5"]} if "top5" in own else {})})
        row: dict[str, Any] = {"round": rnd, "phase": phase, "num_clusters": len(self.clusters) or None}
        for key in ("teacher_acc", "client_acc", "teacher_top5", "client_top5"):
            if key not in per_client[0]:
                continue
            vals = [r[key] for r in per_client if r[key] is not None]
            stats = mean_sem(vals) if vals else {"mean": None, "sem": None}
            row[f"{key}_mean"], row[f"{key}_sem"] = stats["mean"], stats["sem"]
        communicated = rnd >= 1
        row["upload_bytes_per_client"] = self.upload_bytes if communicated else 0
        row["download_bytes_per_client"] = self.download_bytes if communicated else 0
        self.rows.append(row)
        self.client_rows.extend(per_client)
        self.run_dir.append_metrics(row)
        self.tracker.log_round(row)
        teacher = "-" if row["teacher_acc_mean"] is None else f"{row['teacher_acc_mean']:.4f}"
        self.console.print(f"round {rnd} ({phase}): teacher h_pi(i) {teacher}  client f_i {row['client_acc_mean']:.4f}")
        return row

    # ----------------------------------------------------------------- the run
    def run(self) -> dict[str, Any]:
        """Round 0, the PTC round and the IFFT rounds; returns the summary (also written to summary.json)."""
        start = time.perf_counter()
        try:
            return self._rounds(start)
        finally:
            self.executor.close()

    def _rounds(self, start: float) -> dict[str, Any]:
        self._local_training(0, self.ccfg.pretrain_epochs)
        self._evaluate(0, "local-only")
        self.round_seconds[0] = time.perf_counter() - start
        clusters_info: dict[str, Any] = {}
        for rnd in range(1, self.cosmos.rounds + 1):
            round_start = time.perf_counter()
            if rnd > 1:
                self._local_training(rnd, self.ccfg.local_epochs)
            uploads = self._upload(rnd)
            if rnd == 1:
                clusters_info = self._cluster(uploads)
            teacher_labels = self._teacher_round(rnd, uploads)
            self._client_distillation(rnd, teacher_labels)
            self._evaluate(rnd, "PTC" if rnd == 1 else "IFFT")
            self.round_seconds[rnd] = time.perf_counter() - round_start
        self._write_clients_csv()
        return self._summary(clusters_info, time.perf_counter() - start)

    def _write_clients_csv(self) -> None:
        keys = list(self.client_rows[-1].keys())
        lines = [",".join(keys)]
        for r in self.client_rows:
            lines.append(",".join("" if r.get(k) is None else (f"{r[k]:.6f}" if isinstance(r[k], float) else str(r[k]))
                                  for k in keys))
        self.run_dir.write_text("clients.csv", "\n".join(lines) + "\n")

    def _summary(self, clusters_info: dict[str, Any], wall: float) -> dict[str, Any]:
        def entry(row: dict[str, Any]) -> dict[str, Any]:
            out = {"round": row["round"],
                   "teacher_acc": {"mean": row["teacher_acc_mean"], "sem": row["teacher_acc_sem"]},
                   "client_acc": {"mean": row["client_acc_mean"], "sem": row["client_acc_sem"]}}
            if "teacher_top5_mean" in row:
                out["teacher_top5"] = {"mean": row["teacher_top5_mean"], "sem": row["teacher_top5_sem"]}
                out["client_top5"] = {"mean": row["client_top5_mean"], "sem": row["client_top5_sem"]}
            return out

        federated = self.rows[1:]
        best = max(federated, key=lambda r: (r["teacher_acc_mean"], -r["round"]))
        summary = {
            "headline": "final round, mean personalized accuracy of the cluster teacher h_pi(i) over clients",
            "final": entry(self.rows[-1]),
            "best": {**entry(best), "note": "round with the highest mean teacher accuracy; reported beside final, never used to select anything"},
            "local_only": {"round": 0, "client_acc": {"mean": self.rows[0]["client_acc_mean"],
                                                      "sem": self.rows[0]["client_acc_sem"]}},
            "clusters": {"K": clusters_info.get("K"), "b0": clusters_info.get("b0"),
                         "assignment": clusters_info.get("assignment"),
                         "adjusted_rand_index": clusters_info.get("adjusted_rand_index")},
            "communication": {"upload_bytes_per_client_per_round": self.upload_bytes,
                              "upload_dtype": self.comm.upload_dtype, "top_k": self.comm.top_k,
                              "download_bytes_per_client_per_round": self.download_bytes,
                              "rounds": self.cosmos.rounds,
                              "public_samples": len(self.public), "num_classes": self.fed.num_classes},
            "num_clients": len(self.clients),
            "backbones": {"clients": [c.backbone for c in self.clients], "teacher": self.scfg.backbone},
            "wall_seconds": round(wall, 2),
            "stage_seconds": {k: round(v, 2) for k, v in self.timer.seconds.items()},
            "round_seconds": {str(k): round(v, 2) for k, v in self.round_seconds.items()},
            "stage_seconds_by_round": {r: {k: round(v, 2) for k, v in st.items()} for r, st in self.timer.by_round.items()},
        }
        self.run_dir.write_json("summary.json", summary)
        self.tracker.summary(summary)
        return summary

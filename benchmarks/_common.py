"""Shared set-up for the benchmarks: a quickstart-like federation, one timed COSMOS round, the JSON tail."""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path
from typing import Sequence

import torch

from cosmos_pl.algorithms import COSMOS
from cosmos_pl.data import FashionMNIST, GroupDirichlet, build_federation
from cosmos_pl.training.client import ClientConfig
from cosmos_pl.execution.executor import ExecutorConfig
from cosmos_pl.federated.runner import Runner, RunSettings
from cosmos_pl.training.config import TrainerConfig
from cosmos_pl.transforms import Transformations

LR_LABELS, LR_PSEUDO = 1e-3, 1e-4  # Appendix C: Adam 1e-3 on labels, 1e-4 on pseudo-labels (teachers too)
CLIENT_BACKBONES = ["test_efficientnet", "mobilenetv3_small_050", "squeezenet1_1", "lcnet_050"]
TEACHER_BACKBONE = "test_efficientnet"


def adam(lr: float):
    def make(params):
        return torch.optim.Adam(params, lr=lr)

    return make


def build_runner(clients: int, public: int, per_client: int = 480, clients_per_group: int = 5,
                 executor: ExecutorConfig | None = None) -> Runner:
    """Fashion-MNIST with |U| = ``public`` and about ``per_client`` labelled images per client, groups of
    ``clients_per_group`` clients (K = clients / clients_per_group teachers), untrained models, and COSMOS's
    clusters set to the true groups (timing only; the algorithm itself never reads them). Writes no files."""
    labelled = clients * per_client
    fed = build_federation(FashionMNIST().load(), GroupDirichlet(num_groups=max(1, clients // clients_per_group)),
                           clients, public_fraction=public / (labelled + public),
                           max_train_samples=labelled + public, seed=0)
    client_config = ClientConfig(backbones=CLIENT_BACKBONES, batch_size=32, optimizer=adam(LR_LABELS),
                                 distill_optimizer=adam(LR_PSEUDO))
    algorithm = COSMOS(teacher_backbone=TEACHER_BACKBONE, teacher_batch_size=32, teacher_epochs=1,
                       teacher_optimizer=adam(LR_PSEUDO))
    runner = Runner(fed, algorithm, client_config, RunSettings(
        rounds=2, seed=0, transformations=Transformations(translate=2), trainer=TrainerConfig(accelerator="auto"),
        executor=executor))
    groups = fed.partition.groups
    algorithm.set_clusters([[i for i in range(clients) if groups[i] == g] for g in sorted(set(groups.tolist()))])
    return runner


def cosmos_round(runner: Runner, rnd: int = 2) -> float:
    """Seconds for one IFFT round through cosmos-pl: local fine-tune, upload, teachers, client distillation."""
    start = time.perf_counter()
    runner.train_round(rnd)
    return time.perf_counter() - start


def machine() -> dict:
    gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
            "torch_threads": torch.get_num_threads(), "gpus": gpus, "torch": torch.__version__,
            "python": platform.python_version()}


def emit(figures: dict) -> None:
    """Print the machine, then one final line of JSON holding the figures (for trackers)."""
    print("machine:", machine())
    print(json.dumps({**figures, "machine": machine()}, sort_keys=True))


def ptc_uploads(config: Path, seed: int, num_clients: int, cache: Path, round0: Path,
                extra: Sequence[str] = (), tag: str = "") -> tuple:
    """``(uploads [N, n, M], true groups [N])`` of a config's first COSMOS round: round 0 as ``cosmos-pl fit`` trains
    it (kept in the round-0 cache ``round0``), then every client's soft upload on U, what the server clusters.
    ``num_clients`` 0 keeps the config's N; ``extra``: more fit flags (e.g. ``--clients.pretrain_epochs 1``), named
    by ``tag`` in the cache. Kept in ``cache`` as .npz by config, N, tag and seed."""
    import numpy as np

    target = cache / f"{config.stem}_n{num_clients}{tag}_s{seed}.npz"
    if target.is_file():
        got = np.load(target)
        return torch.from_numpy(got["uploads"]), got["groups"]
    from lightning.fabric.utilities.seed import seed_everything

    from cosmos_pl.algorithms.base import ServerResult
    from cosmos_pl.objectives.protocol import Upload
    from cosmos_pl.config import validate_config
    from cosmos_pl.config import round0_key
    from cosmos_pl.parsers import build_fit_parser

    class Uploads(COSMOS):  # COSMOS's first round up to its server step: the upload, kept
        def plan(self, rnd):
            return [Upload("soft")]

        def server_step(self, rnd, uploads):
            self.got = uploads
            return ServerResult({}, 0)

    args = ["--config", str(config), "--seed", str(seed), "--wandb.mode", "disabled"]
    if num_clients:
        args += ["--data.num_clients", str(num_clients)]
    args += list(extra)
    parser = build_fit_parser()
    cfg = parser.parse_args(args)
    init = parser.instantiate(cfg)
    validate_config(init)
    seed_everything(init.seed, verbose=False)
    _, federation = init.data.build(init.seed)
    algorithm = Uploads(teacher_backbone=init.algorithm.teacher_backbone)
    runner = Runner(federation, algorithm, init.clients, RunSettings(
        rounds=1, seed=init.seed, transformations=init.transformations, trainer=init.trainer, executor=init.executor,
        communication=init.communication))
    try:
        runner.pretrain(round0, round0_key(cfg, runner.executor.threads))
        runner.train_round(1)
    finally:
        runner.executor.close()
    uploads = torch.stack([algorithm.got[i] for i in sorted(algorithm.got)])
    groups = np.asarray(federation.partition.groups)
    cache.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(".tmp.npz")
    np.savez(tmp, uploads=uploads.numpy(), groups=groups)
    tmp.replace(target)  # atomic: a reader sees no file or the whole one
    return uploads, groups

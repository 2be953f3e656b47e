"""One COSMOS IFFT round of the quickstart through cosmos-pl, and the same work as a bare PyTorch loop.

Same models, batches, transformations, losses and optimizer steps; the bare loop has no Lightning.
Prints both times and their ratio; the last line is JSON with key ``ratio`` (cosmos-pl / bare).

    .venv/bin/python benchmarks/round_time.py [--clients 20] [--max-train 12000]
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import emit  # noqa: E402

from cosmos_pl.aggregation import aggregate  # noqa: E402
from cosmos_pl.data import FashionMNIST, GroupDirichlet, build_federation  # noqa: E402
from cosmos_pl.federated.loop import FederatedLoop  # noqa: E402
from cosmos_pl.federated.stages import TrainerConfig, stage_seed  # noqa: E402
from cosmos_pl.losses import distillation_loss  # noqa: E402
from cosmos_pl.config import ClientConfig, CosmosConfig, ServerConfig  # noqa: E402
from cosmos_pl.transforms import Transformations, prepare  # noqa: E402


class _NullRunDir:
    def write_json(self, *a, **k): ...
    def write_text(self, *a, **k): ...
    def append_metrics(self, *a, **k): ...


class _NullTracker:
    def log_round(self, *a): ...


def _bare_epochs(model, tensors, epochs, batch_size, lr, step, seed, channels_last=True):
    """A plain loop over the same shuffled batches (torch RandomSampler order under the same seed)."""
    from lightning.fabric.utilities.seed import seed_everything
    from torch.utils.data import BatchSampler, RandomSampler

    seed_everything(seed, verbose=False)
    model.train()
    if channels_last:
        model.to(memory_format=torch.channels_last)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    n = len(tensors[0])
    for _ in range(epochs):
        drop_last = n > batch_size and n % batch_size == 1
        for idx in BatchSampler(RandomSampler(range(n)), batch_size, drop_last):
            ix = torch.as_tensor(idx)
            loss = step(model, *(t[ix] for t in tensors))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()


def _bare_predict(model, x, bs=1024):
    model.eval()
    with torch.inference_mode():
        out = torch.cat([model(prepare(x[i:i + bs], channels_last=True)).softmax(1) for i in range(0, len(x), bs)])
    model.train()
    return out


def bare_round(loop: FederatedLoop, rnd: int) -> float:
    cc, sc, cos = loop.ccfg, loop.scfg, loop.cosmos
    t = cos.transformations
    lr_local = 1e-3
    lr_pseudo_client = 1e-4
    lr_teacher = sc.optimizer.keywords.get("lr", 1e-4) if hasattr(sc.optimizer, "keywords") else 1e-4

    def ce_step(m, x, y):
        return F.cross_entropy(m(prepare(x, t, channels_last=True)), y)

    def kd_step(m, x, target, w):
        b = len(x)
        logits = m(torch.cat([prepare(x, channels_last=True), prepare(x, t, perturb=True, channels_last=True)]))
        return distillation_loss(logits[:b], target, logits[b:][None], cos.lambda_, w)[0]

    start = time.perf_counter()
    for c in loop.clients:
        _bare_epochs(c.model, (c.data.x, c.data.y), cc.local_epochs, cc.batch_size, lr_local, ce_step,
                     stage_seed(loop.seed, rnd, "local", c.id))
    uploads = torch.stack([_bare_predict(c.model, loop.public) for c in loop.clients])
    labels = []
    ones = torch.ones(len(loop.public))
    for k, members in enumerate(loop.clusters):
        target = aggregate(uploads[members], sc.aggregation)
        _bare_epochs(loop.teachers[k], (loop.public, target, ones), sc.distill_epochs, sc.batch_size, lr_teacher,
                     kd_step, stage_seed(loop.seed, rnd, "teacher", k))
        labels.append(_bare_predict(loop.teachers[k], loop.public))
    for c in loop.clients:
        _bare_epochs(c.model, (loop.public, labels[c.cluster], ones), cc.distill_epochs, cc.batch_size,
                     lr_pseudo_client, kd_step, stage_seed(loop.seed, rnd, "distill", c.id))
    return time.perf_counter() - start


def cosmos_round(loop: FederatedLoop, rnd: int) -> float:
    start = time.perf_counter()
    loop._local_training(rnd, loop.ccfg.local_epochs)
    uploads = loop._upload(rnd)
    labels = loop._teacher_round(rnd, uploads)
    loop._client_distillation(rnd, labels)
    return time.perf_counter() - start


def build_loop(clients: int, max_train: int) -> FederatedLoop:
    fed = build_federation(FashionMNIST().load(), GroupDirichlet(), clients, max_train_samples=max_train, seed=0)
    adam = lambda lr: (lambda p: torch.optim.Adam(p, lr=lr))  # noqa: E731
    ccfg = ClientConfig(backbones=["test_efficientnet", "mobilenetv3_small_050", "squeezenet1_1", "lcnet_050"],
                        batch_size=32, optimizer=adam(1e-3), distill_optimizer=adam(1e-4))
    scfg = ServerConfig(backbone="test_efficientnet", batch_size=32, distill_epochs=2, optimizer=adam(1e-3))
    scfg.optimizer.keywords = {"lr": 1e-3}
    cos = CosmosConfig(transformations=Transformations(translate=2))
    loop = FederatedLoop(fed, ccfg, scfg, cos, TrainerConfig(accelerator="cpu"), 0, _NullRunDir(), _NullTracker())
    groups = fed.partition.groups  # fixed clusters for timing only: the true groups, so K matches the quickstart
    loop.clusters = [[i for i in range(clients) if groups[i] == g] for g in sorted(set(groups))]
    for k, members in enumerate(loop.clusters):
        for i in members:
            loop.clients[i].cluster = k
    loop.teachers = [loop._backbone(scfg.backbone, stage_seed(0, 0, "teacher_init", k)) for k in range(len(loop.clusters))]
    return loop


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--clients", type=int, default=20)
    ap.add_argument("--max-train", type=int, default=12000)
    ap.add_argument("--repeats", type=int, default=1)
    args = ap.parse_args()
    base = build_loop(args.clients, args.max_train)
    ours, bare = [], []
    for r in range(args.repeats):
        # identical starting models for both paths; alternate the order to share any warm-up effects
        a, b = copy.deepcopy(base), copy.deepcopy(base)
        if r % 2 == 0:
            ours.append(cosmos_round(a, 2)); bare.append(bare_round(b, 2))
        else:
            bare.append(bare_round(b, 2)); ours.append(cosmos_round(a, 2))
    t_ours, t_bare = min(ours), min(bare)
    print(f"one IFFT round, {args.clients} clients, |U| = {len(base.public)}: cosmos-pl {t_ours:.1f} s, "
          f"bare PyTorch {t_bare:.1f} s, ratio {t_ours / t_bare:.3f}")
    emit({"cosmos_pl_seconds": round(t_ours, 2), "bare_seconds": round(t_bare, 2), "ratio": round(t_ours / t_bare, 4),
          "clients": args.clients, "public_samples": len(base.public)})


if __name__ == "__main__":
    main()

"""One COSMOS IFFT round of the quickstart through cosmos-pl, and the same work as a bare PyTorch loop.

Same models, batches (same shuffles under the same seeds), transformations, losses and optimizer steps;
the bare loop has no Lightning. Prints both times and their ratio; the last line is JSON with key
``ratio`` (cosmos-pl / bare).

    .venv/bin/python benchmarks/round_time.py [--clients 20] [--public 2400] [--repeats 1]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from lightning.fabric.utilities.seed import seed_everything
from torch.utils.data import BatchSampler, RandomSampler

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import LR_LABELS, LR_PSEUDO, build_runner, cosmos_round, emit  # noqa: E402

from cosmos_pl.aggregation import aggregate  # noqa: E402
from cosmos_pl.objectives.distill import distillation_loss  # noqa: E402
from cosmos_pl.training.config import stage_seed  # noqa: E402
from cosmos_pl.transforms import prepare  # noqa: E402


def _epochs(model, tensors, epochs, batch_size, lr, step, seed):
    seed_everything(seed, verbose=False)
    model.train().to(memory_format=torch.channels_last)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    n = len(tensors[0])
    drop_last = n > batch_size and n % batch_size == 1
    for _ in range(epochs):
        for idx in BatchSampler(RandomSampler(range(n)), batch_size, drop_last):
            ix = torch.as_tensor(idx)
            loss = step(model, *(t[ix] for t in tensors))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()


def _predict(model, x, batch_size=1024):
    model.eval()
    with torch.inference_mode():
        out = torch.cat([model(prepare(x[i:i + batch_size], channels_last=True)).softmax(1)
                         for i in range(0, len(x), batch_size)])
    model.train()
    return out


def bare_round(runner, rnd: int = 2) -> float:
    cc, algo, t = runner.client_config, runner.algorithm, runner.runtime.transformations
    clients = runner.clients.clients  # the in-process clients: models and data

    def ce(m, x, y):
        return F.cross_entropy(m(prepare(x, t, channels_last=True)), y)

    def kd(m, x, target, w):
        b = len(x)
        logits = m(torch.cat([prepare(x, channels_last=True), prepare(x, t, perturb=True, channels_last=True)]))
        return distillation_loss(logits[:b], target, logits[b:][None], algo.lambda_, w)[0]

    start = time.perf_counter()
    for c in clients:
        _epochs(c.model, (c.data.x, c.data.y), cc.local_epochs, cc.batch_size, LR_LABELS, ce,
                stage_seed(runner.seed, rnd, "local", c.id))
    uploads = torch.stack([_predict(c.model, runner.public) for c in clients])
    ones = torch.ones(len(runner.public))
    labels = []
    for k, members in enumerate(algo.clusters):
        target = aggregate(uploads[members], algo.aggregation)
        _epochs(algo.teachers[k], (runner.public, target, ones), algo.teacher_epochs, algo.teacher_batch_size,
                LR_PSEUDO, kd, stage_seed(runner.seed, rnd, "teacher", k))
        labels.append(_predict(algo.teachers[k], runner.public))
    for c in clients:
        _epochs(c.model, (runner.public, labels[algo.assignment[c.id]], ones), cc.distill_epochs, cc.batch_size,
                LR_PSEUDO, kd, stage_seed(runner.seed, rnd, "distill", c.id))
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=20)
    ap.add_argument("--public", type=int, default=2400, help="|U| (the quickstart's is 2400)")
    ap.add_argument("--repeats", type=int, default=1)
    args = ap.parse_args()
    ours, bare = [], []
    for r in range(args.repeats):
        a, b = build_runner(args.clients, args.public), build_runner(args.clients, args.public)  # seeded: identical models
        if r % 2 == 0:  # alternate the order so neither path always runs first
            ours.append(cosmos_round(a)); bare.append(bare_round(b))
        else:
            bare.append(bare_round(b)); ours.append(cosmos_round(a))
    t_ours, t_bare = min(ours), min(bare)
    print(f"one IFFT round, {args.clients} clients, |U| = {len(a.public)}: cosmos-pl {t_ours:.1f} s, "
          f"bare PyTorch {t_bare:.1f} s, ratio {t_ours / t_bare:.3f}")
    emit({"cosmos_pl_seconds": round(t_ours, 2), "bare_seconds": round(t_bare, 2),
          "ratio": round(t_ours / t_bare, 4), "clients": args.clients, "public_samples": len(a.public)})


if __name__ == "__main__":
    main()

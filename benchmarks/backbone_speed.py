"""Training and inference images per second of candidate backbones on this machine (to size configs).

    .venv/bin/python benchmarks/backbone_speed.py [--size 28] [--chans 1] [--threads 2] [names ...]

For each backbone: parameters, training images/s (Adam step, batch 32, channels-last, random T) and inference
images/s (batch 1024). The last line is JSON.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import emit  # noqa: E402

from cosmos_pl.models import create_backbone  # noqa: E402
from cosmos_pl.transforms import Transformations, prepare  # noqa: E402

DEFAULT = ["test_efficientnet", "lcnet_035", "lcnet_050", "mobilenetv3_small_050", "squeezenet1_1", "resnet10t",
           "resnet18", "test_resnet"]


def measure(name: str, size: int, chans: int, steps: int = 12, batch: int = 32) -> dict:
    torch.manual_seed(0)
    model = create_backbone(name, 10, chans, size).to(memory_format=torch.channels_last)
    opt = torch.optim.Adam(model.parameters(), 1e-3)
    t = Transformations(translate=2)
    x = torch.randint(0, 256, (batch, chans, size, size), dtype=torch.uint8)
    y = torch.randint(0, 10, (batch,))
    for i in range(steps + 2):
        if i == 2:
            start = time.perf_counter()
        loss = F.cross_entropy(model(prepare(x, t, channels_last=True)), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    train = steps * batch / (time.perf_counter() - start)
    model.eval()
    xb = torch.randint(0, 256, (1024, chans, size, size), dtype=torch.uint8)
    with torch.inference_mode():
        model(prepare(xb[:64], channels_last=True))
        start = time.perf_counter()
        model(prepare(xb, channels_last=True))
        infer = 1024 / (time.perf_counter() - start)
    return {"params": sum(p.numel() for p in model.parameters()), "train_img_s": round(train, 1),
            "infer_img_s": round(infer, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("names", nargs="*", default=DEFAULT)
    ap.add_argument("--size", type=int, default=28)
    ap.add_argument("--chans", type=int, default=1)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    out = {}
    for name in args.names:
        out[name] = measure(name, args.size, args.chans)
        r = out[name]
        print(f"{name:24s} {r['params']:>10,d} params  train {r['train_img_s']:8.1f} img/s  "
              f"inference {r['infer_img_s']:9.1f} img/s", flush=True)
    emit({"size": args.size, "chans": args.chans, "threads": torch.get_num_threads(), "backbones": out})


if __name__ == "__main__":
    main()

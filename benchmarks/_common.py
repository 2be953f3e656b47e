"""Shared set-up for the benchmarks: the machine line and the JSON tail line."""

from __future__ import annotations

import json
import os
import platform

import torch


def machine() -> dict:
    gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
            "torch_threads": torch.get_num_threads(), "gpus": gpus, "torch": torch.__version__,
            "python": platform.python_version()}


def emit(figures: dict) -> None:
    """Print the machine, then one final line of JSON holding the figures (for trackers)."""
    print("machine:", machine())
    print(json.dumps({**figures, "machine": machine()}, sort_keys=True))

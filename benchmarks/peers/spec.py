"""The one federation every peer runs, and the record each adapter writes.

The partition is a folder written by ``cosmos-pl export-partition`` (``client_<i>/data.npz`` with ``x_train`` uint8
``[n_i, C, H, W]``, ``y_train`` ``[n_i]``, ``x_test``, ``y_test``; ``public.npz`` with U ``x_public`` uint8
``[n, C, H, W]`` and ``classes``). Every system reads that folder, builds the same backbone with
:func:`cosmos_pl.models.create_backbone`, normalizes pixels as ``(x / 255 - 0.5) / 0.5`` (cosmos-pl's
:func:`cosmos_pl.transforms.prepare` and Flower's quickstart ``Normalize((0.5,), (0.5,))``), trains with Adam
(a new optimizer each round) and no augmentation, and scores every client on its own test set each round.
"""

from __future__ import annotations

import json
import os
import platform
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from cosmos_pl.files import atomic_write_text

__all__ = ["Spec", "ClientData", "load_partition", "make_model", "normalize", "write_record", "versions"]


@dataclass(frozen=True)
class Spec:
    """The federation's training settings, the same for every system.

    Args:
        rounds: federated rounds R (FedAvg: local epochs then averaging; FedMD: digest then revisit).
        local_epochs: epochs of cross-entropy on D_i per round (FedMD's revisit).
        digest_epochs: FedMD's epochs over U towards the consensus per round.
        batch_size: samples per step, for training and for FedMD's digest.
        lr: Adam's learning rate (labels and digest alike).
        backbone: a :func:`cosmos_pl.models.create_backbone` name, every client's.
        threads: torch CPU threads of each system's process (and its workers).
        seed: the partition's seed and every system's own seed.
    """

    rounds: int = 10
    local_epochs: int = 1
    digest_epochs: int = 1
    batch_size: int = 32
    lr: float = 1e-3
    backbone: str = "test_efficientnet"
    threads: int = 2
    seed: int = 0

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "Spec":
        return cls(**json.loads(text))


@dataclass
class ClientData:
    """One client's data as stored: ``x_train`` uint8 ``[n_i, C, H, W]``, ``y_train`` int64 ``[n_i]``, and the
    same for its test set."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray


def load_partition(folder: str | Path) -> tuple[list[ClientData], np.ndarray, list[str]]:
    """``(clients in id order, U uint8 [n, C, H, W], class names)`` from an ``export-partition`` folder.

    Raises:
        FileNotFoundError: ``folder`` has no ``public.npz`` or no ``client_0``.
    """
    folder = Path(folder)
    if not (folder / "public.npz").is_file() or not (folder / "client_0").is_dir():
        raise FileNotFoundError(f"{folder}: not a cosmos-pl export-partition folder (public.npz, client_0/, ...); "
                                "write one with cosmos-pl export-partition --config CONFIG --out FOLDER")
    clients = []
    i = 0
    while (folder / f"client_{i}" / "data.npz").is_file():
        with np.load(folder / f"client_{i}" / "data.npz") as z:
            clients.append(ClientData(z["x_train"], z["y_train"].astype(np.int64), z["x_test"],
                                      z["y_test"].astype(np.int64)))
        i += 1
    with np.load(folder / "public.npz") as z:
        public, classes = z["x_public"], [str(c) for c in z["classes"]]
    return clients, public, classes


def normalize(x):
    """uint8 ``[B, C, H, W]`` (numpy or torch) -> float32 torch ``[B, C, H, W]`` in [-1, 1]."""
    import torch

    x = torch.as_tensor(x)
    return x.float().div(255.0).sub(0.5).div(0.5)


def make_model(spec: Spec, num_classes: int, in_chans: int, image_size: int):
    """The shared backbone, freshly initialised (``torch.manual_seed`` beforehand fixes its weights)."""
    from cosmos_pl.models import create_backbone

    return create_backbone(spec.backbone, num_classes, in_chans, image_size)


def versions(*packages: str) -> dict[str, str]:
    """Installed versions of ``packages`` (``"missing"`` where not installed) and Python's."""
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for name in packages:
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "missing"
    return out


def write_record(path: str | Path, *, system: str, algorithm: str, round_end_unix: list[float],
                 client_accuracy: list[float], bytes_per_round: int, payload_bytes_per_round: int,
                 extra: dict | None = None) -> None:
    """Write an adapter's result as JSON (atomically).

    Args:
        round_end_unix: ``time.time()`` at the end of rounds 1..R (training and evaluation done).
        client_accuracy: after the last round, each client's top-1 accuracy on its own test set, client id order.
        bytes_per_round: every tensor's bytes in one round's messages, server->clients plus clients->server,
            training and evaluation alike (what the system would put on a wire).
        payload_bytes_per_round: the algorithm's own payload in the training exchange only (FedAvg: weights up
            and down; FedMD: what the clients upload and the consensus they get).
        extra: anything else the adapter reports (versions, notes).
    """
    record = {"system": system, "algorithm": algorithm, "round_end_unix": round_end_unix,
              "client_accuracy": client_accuracy,
              "accuracy": float(np.mean(client_accuracy)) if client_accuracy else None,
              "bytes_per_round": int(bytes_per_round), "payload_bytes_per_round": int(payload_bytes_per_round),
              "pid": os.getpid(), "written_unix": time.time(),
              **(extra or {})}
    atomic_write_text(Path(path), json.dumps(record, indent=1) + "\n")

"""The clients' settings and the state a client keeps between rounds."""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import nn

from cosmos_pl.data import ClientData
from cosmos_pl.errors import check
from cosmos_pl.models import check_backbone_name
from cosmos_pl.optim import OptimizerCallable

__all__ = ["ClientConfig", "Client"]


def _adam(lr: float):
    return field(default_factory=lambda: {"class_path": "torch.optim.Adam", "init_args": {"lr": lr}})


@dataclass
class ClientConfig:
    """The clients: heterogeneous backbones and their two objectives (shared by every algorithm).

    Args:
        backbones: timm (or torchvision alexnet/squeezenet1_0/squeezenet1_1) names, assigned to clients round-robin.
        pretrain_epochs: E0, local epochs of cross-entropy in round 0, before the first upload (every algorithm).
        local_epochs: epochs on the client's own data per round (COSMOS: IFFT local fine-tune; FedMD: revisit; ...).
        distill_epochs: epochs over U per round distilling the server's pseudo-labels (COSMOS Eq. 2; FedMD digest).
        batch_size: batch size of every client objective.
        optimizer: optimizer on labels (paper: Adam lr 1e-3).
        distill_optimizer: optimizer on pseudo-labels (paper: Adam lr 1e-4).

    Raises:
        ConfigError: an unknown backbone name (naming ``clients.backbones[i]`` and close names), when the
            settings are read, before any data is loaded.
    """

    backbones: list[str] = field(default_factory=lambda: ["mobilenetv3_small_050", "lcnet_050"])
    pretrain_epochs: int = 5
    local_epochs: int = 1
    distill_epochs: int = 1
    batch_size: int = 64
    optimizer: OptimizerCallable = _adam(1e-3)
    distill_optimizer: OptimizerCallable = _adam(1e-4)

    def __post_init__(self) -> None:
        """Raises ConfigError for a value out of range (names and optimizers: ``cosmos_pl.config.validate_config``)."""
        check(len(self.backbones) > 0, "clients.backbones", self.backbones, "give at least one timm or torchvision name")
        for key in ("pretrain_epochs", "local_epochs", "distill_epochs"):
            value = getattr(self, key)
            check(value >= 0, f"clients.{key}", value, "must be >= 0 epochs")
        check(self.batch_size >= 1, "clients.batch_size", self.batch_size, "must be >= 1 (>= 2 for BatchNorm backbones)")
        for i, name in enumerate(self.backbones):
            check_backbone_name(name, f"clients.backbones[{i}]")


@dataclass
class Client:
    """One client: its id, architecture name, model f_i and private data D_i (kept in memory, not written to disk
    and read back each round)."""

    id: int
    backbone: str
    model: nn.Module
    data: ClientData

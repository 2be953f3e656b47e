"""A seeded backbone (every model the run builds: the clients', the teachers', the server's reference copies), and a
client's architecture and round-0 model, the same on every transport (in-process and on a Flower node)."""

from __future__ import annotations

import torch
from torch import nn

from cosmos_pl.algorithms.base import Algorithm
from cosmos_pl.models import create_backbone
from cosmos_pl.training.config import stage_seed

__all__ = ["client_backbone", "initial_model", "seeded_backbone"]


def client_backbone(backbones: list[str], client_id: int) -> str:
    """Client ``client_id``'s architecture: ``clients.backbones`` assigned round-robin."""
    return backbones[client_id % len(backbones)]


def seeded_backbone(name: str, seed: int, num_classes: int, in_chans: int, image_shape: tuple[int, int]) -> nn.Module:
    """A Kaiming-initialized ``name`` for ``in_chans`` x ``image_shape`` images and M = ``num_classes``, created
    under ``torch.manual_seed(seed)``; its ``backbone_name`` says which (a node rebuilds a model it is sent to score
    from it)."""
    torch.manual_seed(seed)
    model = create_backbone(name, num_classes, in_chans, max(image_shape))
    model.backbone_name = name
    return model


def initial_model(algorithm: Algorithm, backbone: str, client_id: int, seed: int, num_classes: int, in_chans: int,
                  image_shape: tuple[int, int]) -> nn.Module:
    """Client ``client_id``'s round-0 model: a Kaiming-initialized ``backbone`` for ``in_chans`` x ``image_shape``
    images and M = ``num_classes``, created under the seed of (``seed``, round 0, "init", the client id; id 0 for an
    algorithm whose clients share their initial weights, as parameter averaging needs), then wrapped as the
    algorithm holds it (:meth:`~cosmos_pl.algorithms.base.Algorithm.client_model`). Its ``backbone_name`` says
    which architecture it is."""
    model_seed = stage_seed(seed, 0, "init", 0 if algorithm.shared_init else client_id)
    return algorithm.client_model(seeded_backbone(backbone, model_seed, num_classes, in_chans, image_shape))

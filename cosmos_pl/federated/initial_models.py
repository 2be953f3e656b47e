"""A client's architecture and its round-0 model, the same on every transport (in-process and on a Flower node)."""

from __future__ import annotations

import torch
from torch import nn

from cosmos_pl.algorithms.base import Algorithm
from cosmos_pl.models import create_backbone
from cosmos_pl.training.config import stage_seed

__all__ = ["client_backbone", "initial_model"]


def client_backbone(backbones: list[str], client_id: int) -> str:
    """Client ``client_id``'s architecture: ``clients.backbones`` assigned round-robin."""
    return backbones[client_id % len(backbones)]


def initial_model(algorithm: Algorithm, backbone: str, client_id: int, seed: int, num_classes: int, in_chans: int,
                  image_shape: tuple[int, int]) -> nn.Module:
    """Client ``client_id``'s round-0 model: a Kaiming-initialized ``backbone`` for ``in_chans`` x ``image_shape``
    images and M = ``num_classes``, created under the seed of (``seed``, round 0, "init", the client id; id 0 for an
    algorithm whose clients share their initial weights, as parameter averaging needs), then wrapped as the
    algorithm holds it (:meth:`~cosmos_pl.algorithms.base.Algorithm.client_model`). Its ``backbone_name`` says
    which architecture it is."""
    torch.manual_seed(stage_seed(seed, 0, "init", 0 if algorithm.shared_init else client_id))
    model = create_backbone(backbone, num_classes, in_chans, max(image_shape))
    model.backbone_name = backbone
    return algorithm.client_model(model)

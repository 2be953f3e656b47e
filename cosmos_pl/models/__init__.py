"""Backbones for COSMOS clients and teachers (timm + torchvision, small-input stems); :mod:`cosmos_pl.models.personal`:
a client holding a personal model beside its copy of the global model (Ditto, FedBABU)."""

from cosmos_pl.models.backbones import (
    BACKBONE_REVISION,
    SMALL_INPUT_MAX_SIZE,
    TORCHVISION_BACKBONES,
    available_backbones,
    check_backbone_name,
    check_backbones,
    count_parameters,
    create_backbone,
    kaiming_init_,
)

__all__ = [
    "BACKBONE_REVISION",
    "SMALL_INPUT_MAX_SIZE",
    "TORCHVISION_BACKBONES",
    "available_backbones",
    "check_backbone_name",
    "check_backbones",
    "count_parameters",
    "create_backbone",
    "kaiming_init_",
]

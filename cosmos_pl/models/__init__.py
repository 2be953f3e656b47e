"""Backbones for COSMOS clients and teachers (timm + torchvision, small-input stems)."""

from cosmos_pl.models.backbones import (
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
    "SMALL_INPUT_MAX_SIZE",
    "TORCHVISION_BACKBONES",
    "available_backbones",
    "check_backbone_name",
    "check_backbones",
    "count_parameters",
    "create_backbone",
    "kaiming_init_",
]

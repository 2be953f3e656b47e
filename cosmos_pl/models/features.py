"""The "middle layer" of a classifier: its pre-logits features, the representation pFedCK's personal and interactive
models distil into each other (Zhang and Shi, Electronics 2024) beside their soft predictions.

:func:`features_and_logits` returns both from one pass through the body: for timm models the pooled output of
``forward_features`` as ``forward_head(..., pre_logits=True)`` gives it (EfficientNet, MobileNet, LCNet: after the
global pool and, where the head has one, its 1x1 conv; ResNet: after the global pool), for torchvision's AlexNet the
flattened ``avgpool(features(x))`` its classifier reads, for SqueezeNet the global average of ``features(x)`` (its
classifier is a 1x1 conv per class, so the pooled 512 channels are the last layer before the class maps).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["features_and_logits"]


def features_and_logits(model: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(h, logits)`` of ``model`` on ``x`` ``[B, C, H, W]``: pre-logits features h ``[B, D]`` and the logits
    ``[B, M]`` that ``model(x)`` gives, from one pass through the body.

    Raises:
        TypeError: ``model`` is neither a timm model (``forward_features`` and ``forward_head``) nor a torchvision
            AlexNet or SqueezeNet.
    """
    if callable(getattr(model, "forward_features", None)) and callable(getattr(model, "forward_head", None)):
        body = model.forward_features(x)
        return model.forward_head(body, pre_logits=True).flatten(1), model.forward_head(body)
    name = type(model).__name__
    if name == "AlexNet":
        h = torch.flatten(model.avgpool(model.features(x)), 1)
        return h, model.classifier(h)
    if name == "SqueezeNet":
        body = model.features(x)
        return F.adaptive_avg_pool2d(body, 1).flatten(1), torch.flatten(model.classifier(body), 1)
    raise TypeError(f"{name}: no pre-logits features known for this model (a timm model with forward_features and "
                    "forward_head, torchvision's AlexNet or SqueezeNet)")

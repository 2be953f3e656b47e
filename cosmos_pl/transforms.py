"""Batched image normalization and the permissible transformations T of COSMOS (paper Section 4.1).

Images travel as uint8 ``[B, C, H, W]`` tensors and are turned into floats on the device, in batches:
no per-sample PIL work in the hot loop. Transformations and perturbations act in **pixel space [0, 1]**,
before normalization, and the result is clamped to [0, 1] there; only then is it normalized to [-1, 1]:
a perturbation never leaves the range the model was trained on (clamping a perturbation of normalized
[-1, 1] images to [0, 1] would move pixels out of their range).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from cosmos_pl.errors import check

__all__ = ["Transformations", "to_unit", "normalize", "prepare"]


def to_unit(x: torch.Tensor) -> torch.Tensor:
    """uint8 ``[B, C, H, W]`` in 0..255 -> float32 ``[B, C, H, W]`` in [0, 1] (a float input is returned as float32)."""
    if x.dtype == torch.uint8:
        return x.float().div_(255.0)
    return x.float()


def normalize(x: torch.Tensor) -> torch.Tensor:
    """Pixel space [0, 1] -> model space [-1, 1]: ``(x - 0.5) / 0.5``, shape kept."""
    return x.sub(0.5).div_(0.5)


@dataclass
class Transformations:
    """The permissible transformations T and the perturbation radius d of the transformation ball B(x).

    A view x' of x is ``clamp(T(x) + delta, 0, 1)`` with T a random integer translation (and an optional
    horizontal flip) and ``||delta||_2 <= d * sqrt(C*H*W)`` (d is the per-pixel RMS radius in [0, 1] pixel
    units). Since T(x) lies in [0, 1], the clamp only moves x' closer to T(x), so the bound holds after it.
    Source: COSMOS paper, Section 4.1 (transformation ball B(x), regularizer r_B of Eq. 1-2).

    Args:
        translate: largest shift in pixels along each axis (0 disables translation).
        hflip: also flip horizontally with probability 0.5 (true for natural images, false for digits/letters).
        noise_radius: d, the per-pixel RMS radius of the Gaussian-direction perturbation in [0, 1] units (0 disables it).
    """

    translate: int = 2
    hflip: bool = False
    noise_radius: float = 0.03

    def __post_init__(self) -> None:
        """Raises ConfigError for a negative shift or a radius outside [0, 1]."""
        check(self.translate >= 0, "transformations.translate", self.translate, "must be >= 0 pixels (0: no shift)")
        check(0 <= self.noise_radius <= 1, "transformations.noise_radius", self.noise_radius,
              "must lie in [0, 1] (a per-pixel RMS radius in [0, 1] pixel units; 0: no perturbation)")

    def augment(self, x: torch.Tensor) -> torch.Tensor:
        """Random T(x): translation (zero padding) and optional flip. ``[B, C, H, W]`` in [0, 1] -> same."""
        if self.translate > 0:
            x = _translate(x, self.translate)
        if self.hflip:
            flip = torch.rand(x.shape[0], device=x.device) < 0.5
            x = torch.where(flip[:, None, None, None], x.flip(-1), x)
        return x

    def perturb(self, x: torch.Tensor) -> torch.Tensor:
        """A view x' in B(x): ``clamp(T(x) + delta, 0, 1)``. ``[B, C, H, W]`` in [0, 1] -> same."""
        x = self.augment(x)
        if self.noise_radius > 0:
            x = (x + _ball_noise(x, self.noise_radius)).clamp_(0.0, 1.0)
        return x


def _translate(x: torch.Tensor, p: int) -> torch.Tensor:
    """Shift each image by its own integer (dy, dx) in [-p, p], filling with zeros."""
    b, _, h, w = x.shape
    padded = F.pad(x, (p, p, p, p))
    dy = torch.randint(0, 2 * p + 1, (b,), device=x.device)
    dx = torch.randint(0, 2 * p + 1, (b,), device=x.device)
    rows = (dy[:, None] + torch.arange(h, device=x.device))[:, None, :, None]  # [B,1,H,1]
    cols = (dx[:, None] + torch.arange(w, device=x.device))[:, None, None, :]  # [B,1,1,W]
    batch = torch.arange(b, device=x.device)[:, None, None, None]
    chan = torch.arange(x.shape[1], device=x.device)[None, :, None, None]
    return padded[batch, chan, rows, cols]


def _ball_noise(x: torch.Tensor, radius: float) -> torch.Tensor:
    """delta with a uniformly random direction and norm ``U(0,1) * radius * sqrt(C*H*W)`` per image."""
    b = x.shape[0]
    direction = torch.randn_like(x)
    norms = direction.flatten(1).norm(dim=1).clamp_min(1e-12)
    scale = torch.rand(b, device=x.device) * radius * math.sqrt(x[0].numel())
    return direction * (scale / norms)[:, None, None, None]


def prepare(x: torch.Tensor, transformations: Transformations | None = None, *, perturb: bool = False,
            channels_last: bool = False) -> torch.Tensor:
    """uint8 batch -> normalized float model input, optionally transformed (T) or perturbed (x' in B(x))."""
    x = to_unit(x)
    if transformations is not None:
        x = transformations.perturb(x) if perturb else transformations.augment(x)
    x = normalize(x)
    return x.contiguous(memory_format=torch.channels_last) if channels_last else x

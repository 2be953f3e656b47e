"""What the server holds of the data: U and the class list, nothing of any client's."""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["ServerData"]


@dataclass
class ServerData:
    """U ``[n, C, H, W]`` uint8 (inputs only: its labels exist nowhere) and the class names (label k is
    ``classes[k]``), from which the server knows M, C and the image size its backbones are built for."""

    public: torch.Tensor
    classes: list[str]

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @property
    def in_chans(self) -> int:
        return int(self.public.shape[1])

    @property
    def image_shape(self) -> tuple[int, int]:
        return int(self.public.shape[2]), int(self.public.shape[3])

"""Co-training on the union of D_i and U labelled by the target's argmax (FedCT's client objective).

The step :class:`UnionFit`; its stage is local training's :func:`~cosmos_pl.objectives.local_fit.fit_supervised` on
the joined data. Only the argmax travels: class indices ``[n]``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Optional

import torch

from cosmos_pl.objectives.local_fit import fit_supervised
from cosmos_pl.objectives.step import ClientStep, StepSettings, Task

if TYPE_CHECKING:
    from cosmos_pl.training.client import Client

__all__ = ["UnionFit"]


@dataclass(frozen=True)
class UnionFit(ClientStep):
    """Cross-entropy on D_i together with U labelled by the argmax of the target (FedCT's co-training).

    Uses ``clients.optimizer``. Only the argmax is read, so only it travels: class indices ``[n]`` (uint8 for
    M <= 256, else int16), as FedCT's bytes count them.
    """

    epochs: int
    stage: ClassVar[str] = "co-training"
    seed_stage: ClassVar[str] = "union"
    stage_id: ClassVar[int] = 6

    def task(self, runtime: StepSettings, client: "Client", rnd: int, target: Optional[torch.Tensor]) -> Task:
        return fit_supervised, dict(self.stage_arguments(runtime, client, rnd),
                                    x=torch.cat([client.data.x, runtime.public]),
                                    y=torch.cat([client.data.y, target.argmax(1)]), epochs=self.epochs)

    def to_wire(self, target: Optional[torch.Tensor]) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
        config, _ = super().to_wire(None)
        m = target.shape[1]
        return {**config, "num_classes": m}, {"labels": target.argmax(1).to(torch.uint8 if m <= 256 else torch.int16)}

    @classmethod
    def from_wire(cls, config: dict[str, Any], arrays: dict[str, torch.Tensor]) -> tuple["ClientStep",
                                                                                          Optional[torch.Tensor]]:
        step, _ = super().from_wire(config, {})
        one_hot = torch.nn.functional.one_hot(arrays["labels"].long(), int(config["num_classes"])).float()
        return step, one_hot

"""FedAvg: sample-weighted averaging of model parameters (homogeneous clients only).

Source: H. B. McMahan, E. Moore, D. Ramage, S. Hampson, B. Agüera y Arcas, "Communication-Efficient Learning of
Deep Networks from Decentralized Data", AISTATS 2017. Each round clients train locally, send their weights, and
the server sends back ``sum_i n_i w_i / sum_i n_i`` (n_i = |D_i|) over the clients that sent one.

It is not model-agnostic: every client must have the same backbone. In cosmos-pl it anchors the communication
comparison (parameters versus pseudo-labels, the paper's Table 4). All clients start from one shared
initialization, as FedAvg assumes. Floating-point state (parameters and BatchNorm statistics) is averaged; integer
counters stay local.

Scored model: the client model f_i (after loading the average, the global model).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from cosmos_pl.algorithms.base import Algorithm, ServerResult
from cosmos_pl.communication import state_dict_bytes
from cosmos_pl.errors import ConfigError

if TYPE_CHECKING:
    from cosmos_pl.algorithms.base import Step

__all__ = ["FedAvg", "global_model_receivers", "weighted_average", "require_one_backbone"]


def require_one_backbone(algorithm: str, backbones: list[str], why: str = "averages parameters") -> None:
    """Parameter averaging (or generating, ``why``) needs one architecture.

    Raises:
        ConfigError: ``backbones`` (the clients' names) holds more than one name.
    """
    names = sorted(set(backbones))
    if len(names) > 1:
        raise ConfigError(f"algorithm {algorithm} {why}, so every client needs the same backbone, but "
                          f"clients.backbones gives {names}: give one name (e.g. clients.backbones: [{names[0]}])")


def global_model_receivers(served: list[int], sampled: list[int], targets: dict[int, Any]) -> list[int]:
    """Parameter averaging keeps one global model that every client holds: ``served`` (the sampled clients still
    running), then the clients not sampled this round that have a target, so that one starts from the global model
    when next sampled. Their bytes are not counted: a round's bytes per client are those of a client that took
    part. Without ``clients_per_round`` every client is sampled and this is ``served``."""
    return served + [i for i in sorted(targets) if i not in sampled]


def weighted_average(states: dict[int, dict[str, torch.Tensor]], sizes: dict[int, int]) -> dict[str, torch.Tensor]:
    """``sum_i n_i w_i / sum_i n_i`` per floating-point tensor over the clients in ``states``.

    Raises:
        ValueError: the total weight is zero.
    """
    ids = sorted(states)
    total = float(sum(sizes[i] for i in ids))
    if total <= 0:
        raise ValueError("FedAvg: the clients that sent weights hold no training samples")
    out = {}
    for key, first in states[ids[0]].items():
        if first.is_floating_point():
            out[key] = sum(states[i][key].double() * (sizes[i] / total) for i in ids).to(first.dtype)
    return out


class FedAvg(Algorithm):
    """Local training, upload weights, sample-weighted average, every client loads it."""

    name = "fedavg"
    shared_init = True
    uses_public = False

    def validate(self, backbones: list[str]) -> None:
        require_one_backbone("FedAvg", backbones)

    def plan(self, rnd: int) -> list[Step]:
        from cosmos_pl.objectives.local_fit import LocalFit
        from cosmos_pl.objectives.protocol import LoadWeights, Upload

        return [LocalFit(self.ctx.local_epochs), Upload("weights"), LoadWeights()]

    def weight_receivers(self, served: list[int], sampled: list[int], targets: dict[int, Any]) -> list[int]:
        return global_model_receivers(served, sampled, targets)

    def server_step(self, rnd: int, uploads: dict[int, Any]) -> ServerResult:
        average = weighted_average(uploads, dict(enumerate(self.ctx.client_sizes)))
        return ServerResult({i: average for i in range(self.ctx.num_clients)}, state_dict_bytes(average))

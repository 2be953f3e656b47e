"""FedSelect: each client grows a mask of personal parameter entries and shares the rest, averaged index by index
(homogeneous clients only).

Source: R. Tamirisa, C. Xie, W. Bao, A. Zhou, R. Arel, A. Shamsian, "FedSelect: Personalized Federated Learning with
Customized Selection of Parameters for Fine-Tuning", CVPR 2024 (arXiv 2404.02478), Algorithm 1 (GradSelect, LocalAlt,
per-index aggregation), and the official code ``lapisrocks/fedselect`` where the paper gives no value. Each client
holds its model, a uint8 mask per parameter (1 = personal, all 0 at the start) and the weights at its last mask
update (:class:`~cosmos_pl.models.selective.Selective`). A round (:class:`~cosmos_pl.objectives.select.SelectFit`):

1. the client writes the server's last average into its shared entries;
2. after every ``every``-th round (official ``lth_epoch_iters``), the ``rate`` (p, official ``prune_percent``)
   fraction of the shared entries of each "weight" tensor with the largest ``|theta - theta_snapshot|`` becomes
   personal, as long as the tensor's personal fraction stays within ``limit`` (alpha, ``prune_target``);
3. LocalAlt: per epoch a pass training the personal entries only, then one training the shared entries only;
4. it sends its parameters (personal entries zeroed) and its masks; the server returns, per index, the unweighted
   mean over the clients that share that index (official ``add_masks`` / ``add_server_weights`` /
   ``div_server_weights``), read by each client at its own shared entries only.

Defaults (the official ``utils/options.py``; the paper names p and alpha but its values are those of the code):
p = 0.25, alpha = 0.8, a mask update every 3 rounds. The official LocalAlt runs 15 epochs of plain SGD at lr 0.05;
here LocalAlt runs ``clients.local_epochs`` epochs with ``clients.optimizer``, like every other baseline's local
training, so a comparison differs in the method alone.

Scored model: the client's model right after LocalAlt, before the next merge (the official ``cross_client_eval``
diagonal). Bytes up: 4 bytes (float32) per shared entry plus the masks at 1 bit per entry, each tensor's mask
rounded up to whole bytes; down: the averages at the client's shared entries (4 bytes each; the client knows its
mask), the largest over the clients. BatchNorm running statistics stay on the client (never sent).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from cosmos_pl.algorithms.base import Algorithm, ServerResult, check_setting
from cosmos_pl.algorithms.fedavg import require_one_backbone
from cosmos_pl.models.selective import MASK_PREFIX, VALUE_PREFIX, Selective

if TYPE_CHECKING:
    from cosmos_pl.algorithms.base import Step

__all__ = ["FedSelect", "per_index_mean", "selective_bytes"]


def per_index_mean(states: dict[int, dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Per parameter and index, the unweighted mean of the values of the clients whose mask is 0 there (shared);
    0 where no client shares the index (no client reads it).

    Args:
        states: client id -> ``{"model.<param>": values, "mask.<param>": uint8 mask (1 = personal)}``, as
            :meth:`~cosmos_pl.models.selective.Selective.weights_to_send` sends them.

    Returns:
        ``{"model.<param>": mean}`` in each parameter's dtype, summed in float64 in client-id order.
    """
    ids = sorted(states)
    out = {}
    for key, first in states[ids[0]].items():
        if not key.startswith(VALUE_PREFIX):
            continue
        mask_key = MASK_PREFIX + key[len(VALUE_PREFIX):]
        total = torch.zeros(first.shape, dtype=torch.float64)
        count = torch.zeros(first.shape, dtype=torch.float64)
        for i in ids:
            shared = states[i][mask_key] == 0
            total += torch.where(shared, states[i][key].double(), torch.zeros((), dtype=torch.float64))
            count += shared
        out[key] = torch.where(count > 0, total / count.clamp_min(1), torch.zeros((), dtype=torch.float64)) \
            .to(first.dtype)
    return out


def selective_bytes(state: dict[str, torch.Tensor], *, with_masks: bool) -> int:
    """Bytes of a FedSelect message: ``element size`` per shared entry (mask 0) of each ``model.<param>``, plus,
    ``with_masks``, each mask at 1 bit per entry rounded up to whole bytes per tensor.

    Args:
        state: ``{"model.<param>": values, "mask.<param>": uint8 mask}`` (the masks say which entries travel).
        with_masks: count the masks (an upload) or not (a download: the client knows its mask).
    """
    total = 0
    for key, values in state.items():
        if key.startswith(VALUE_PREFIX):
            mask = state[MASK_PREFIX + key[len(VALUE_PREFIX):]]
            total += int((mask == 0).sum()) * values.element_size()
            if with_masks:
                total += math.ceil(mask.numel() / 8)
    return total


class FedSelect(Algorithm):
    """Per-client personal masks grown from update sizes, LocalAlt, per-index averaging of the shared entries.

    Args:
        rate: p in [0, 1], the fraction of a tensor's shared entries that becomes personal at each mask update
            (official ``prune_percent`` 25; 0: no entry ever becomes personal, FedAvg with an unweighted mean).
        limit: alpha in [0, 1], the largest personal fraction of a tensor (official ``prune_target`` 80).
        every: a mask update after every ``every``-th round, >= 1 (official ``lth_epoch_iters`` 3); 0: never. A run
            of ``every`` rounds or fewer grows no mask (a 3-round demo needs 1).

    Raises:
        ConfigError: a setting out of range (naming it).
    """

    name = "fedselect"
    shared_init = True
    uses_public = False

    def __init__(self, rate: float = 0.25, limit: float = 0.8, every: int = 3) -> None:
        check_setting("rate", rate, isinstance(rate, (int, float)) and 0 <= rate <= 1, "in [0, 1]")
        check_setting("limit", limit, isinstance(limit, (int, float)) and 0 <= limit <= 1, "in [0, 1]")
        check_setting("every", every, isinstance(every, int) and every >= 0, "an integer >= 0 (0: never)")
        self.rate, self.limit, self.every = float(rate), float(limit), every

    def validate(self, backbones: list[str]) -> None:
        require_one_backbone("FedSelect", backbones)

    def client_model(self, model: nn.Module) -> nn.Module:
        return Selective(model)

    def plan(self, rnd: int) -> list[Step]:
        from cosmos_pl.objectives.protocol import LoadWeights, Upload
        from cosmos_pl.objectives.select import SelectFit

        return [SelectFit(self.ctx.local_epochs, self.rate, self.limit, self.every), Upload("weights"),
                LoadWeights()]

    def upload_bytes(self, client: int, state: dict[str, torch.Tensor]) -> int:
        return selective_bytes(state, with_masks=True)

    def server_step(self, rnd: int, uploads: dict[int, Any]) -> ServerResult:
        bad = [i for i, s in sorted(uploads.items()) for k, t in s.items()
               if k.startswith(MASK_PREFIX) and bool(((t != 0) & (t != 1)).any())]
        if bad:  # cosmos_pl.uploads.check_weights refuses these; a direct caller must not average them either
            raise ValueError(f"FedSelect: clients {sorted(set(bad))} sent masks with values other than 0 and 1")
        mean = per_index_mean(uploads)
        targets, down = {}, 0
        for i, state in uploads.items():  # each client gets the averages at its own shared entries
            targets[i] = {k: torch.where(state[MASK_PREFIX + k[len(VALUE_PREFIX):]] == 0, v, torch.zeros_like(v))
                          for k, v in mean.items()}
            down = max(down, selective_bytes({**targets[i], **{k: t for k, t in state.items()
                                                                if k.startswith(MASK_PREFIX)}}, with_masks=False))
        return ServerResult(targets, down)

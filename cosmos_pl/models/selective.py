"""A FedSelect client's model: its backbone plus, per parameter, which entries are personal and what it needs to grow
and merge that mask.

Source: R. Tamirisa, C. Xie, W. Bao, A. Zhou, R. Arel, A. Shamsian, "FedSelect: Personalized Federated Learning with
Customized Selection of Parameters for Fine-Tuning", CVPR 2024 (arXiv 2404.02478), Algorithm 1; the official code
``lapisrocks/fedselect`` (``fedselect.py``, ``lottery_ticket.py``, ``masked_fedavg.py``). :class:`Selective` holds,
as persistent buffers (so a checkpoint and a Flower node keep them with the model's own state):

- ``mask``: uint8, 1 = personal (trained and kept on the client), 0 = shared (averaged index by index); all 0 at the
  start, as the official ``init_mask_zeros``;
- ``snapshot``: the weights at the last mask update, the reference of the next growth's |delta|; the
  initialization at the start (the official ``client_state_dict_prev``);
- ``pending``: the server's per-index average for this client's shared entries, stored by :meth:`receive_weights`
  and merged by the next round's :class:`~cosmos_pl.objectives.select.SelectFit`, with ``has_pending`` (uint8 0/1).

Merging at the next round's start, not on receipt, keeps the end-of-round evaluation on the model right after local
training, as the official code scores it (``cross_client_eval`` runs before ``broadcast_server_to_client_...``).
Buffers of the backbone (BatchNorm running statistics) are never sent: the official aggregation only averages
"weight" and "bias" entries, so they stay local.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["Selective", "MASK_PREFIX", "VALUE_PREFIX"]

#: The upload's keys: ``model.<param>`` the parameter's values (personal entries zeroed), ``mask.<param>`` its mask.
VALUE_PREFIX, MASK_PREFIX = "model.", "mask."


def _flat(name: str) -> str:
    # buffer names may not contain dots; "__" joins the path parts instead
    return name.replace(".", "__")


class Selective(nn.Module):
    """A backbone with FedSelect's per-parameter masks; ``forward`` is the backbone's (``x`` ``[B, C, H, W]`` ->
    logits ``[B, M]``).

    Args:
        model: the client's backbone (its current weights become ``snapshot``: wrap it at its initialization).

    Raises:
        ValueError: two parameter names map to the same buffer name (a name holding ``__`` where another has ``.``).
    """

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        self.names = [name for name, _ in model.named_parameters()]
        if len({_flat(n) for n in self.names}) != len(self.names):
            raise ValueError("Selective: two parameter names differ only by '.' versus '__'")
        self.mask, self.snapshot, self.pending = nn.Module(), nn.Module(), nn.Module()
        for name, p in model.named_parameters():
            self.mask.register_buffer(_flat(name), torch.zeros(p.shape, dtype=torch.uint8))
            self.snapshot.register_buffer(_flat(name), p.detach().clone())
            self.pending.register_buffer(_flat(name), torch.zeros_like(p.detach()))
        self.register_buffer("has_pending", torch.zeros((), dtype=torch.uint8))
        if hasattr(model, "backbone_name"):
            self.backbone_name = model.backbone_name

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)

    def predictor(self) -> nn.Module:
        """The backbone (:func:`~cosmos_pl.models.personal.personal_model`): what the round-0 cache holds, so FedAvg,
        Ditto and FedSelect share one round 0."""
        return self.model

    def masks(self) -> list[torch.Tensor]:
        """The uint8 masks (1 = personal), one per parameter in ``model.named_parameters()`` order."""
        return [getattr(self.mask, _flat(n)) for n in self.names]

    def snapshots(self) -> list[torch.Tensor]:
        """The weights at the last mask update, one per parameter in ``model.named_parameters()`` order."""
        return [getattr(self.snapshot, _flat(n)) for n in self.names]

    def weights_to_send(self) -> dict[str, torch.Tensor]:
        """The upload: ``model.<param>`` the parameter's values with its personal entries set to 0 (never read by
        the server) and ``mask.<param>`` its uint8 mask (1 = personal), for every parameter; detached copies."""
        out: dict[str, torch.Tensor] = {}
        for (name, p), mask in zip(self.model.named_parameters(), self.masks()):
            out[VALUE_PREFIX + name] = torch.where(mask.bool(), torch.zeros_like(p), p).detach().clone()
            out[MASK_PREFIX + name] = mask.detach().clone()
        return out

    def receive_weights(self, state: dict[str, torch.Tensor]) -> None:
        """Store the server's averages ``{"model.<param>": tensor}`` (read only at this client's shared entries) in
        ``pending``; the next :class:`~cosmos_pl.objectives.select.SelectFit` merges them.

        Raises:
            RuntimeError: a key that is not ``model.<param>`` of this backbone, or a shape that differs.
        """
        params = dict(self.model.named_parameters())
        for key, value in state.items():
            name = key[len(VALUE_PREFIX):]
            if not key.startswith(VALUE_PREFIX) or name not in params or value.shape != params[name].shape:
                raise RuntimeError(f"Selective: unexpected server tensor {key!r} of shape {tuple(value.shape)}")
        for key, value in state.items():
            getattr(self.pending, _flat(key[len(VALUE_PREFIX):])).copy_(value)
        self.has_pending.fill_(1)

    @torch.no_grad()
    def merge_pending(self, masks: list[torch.Tensor]) -> None:
        """Write ``pending`` into the entries that ``masks`` (the masks the client uploaded with) mark shared, then
        clear ``has_pending``; nothing without a pending average."""
        if int(self.has_pending) == 0:
            return
        for (name, p), mask in zip(self.model.named_parameters(), masks):
            pending = getattr(self.pending, _flat(name)).to(p.dtype)
            p.copy_(torch.where(mask.bool(), p, pending))
        self.has_pending.fill_(0)

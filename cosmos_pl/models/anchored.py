"""A client model that remembers the weights it was last sent and uploads its change since: pFedHN's client.

In pFedHN (Shamsian et al., ICML 2021, Algorithm 1) the server sends client i the generated weights
theta_i = h(v_i; phi), the client trains them to theta~_i and sends back ``theta_i - theta~_i``. :class:`Anchored`
keeps theta_i as buffers (``start.*``) beside the model, so the delta is computed where the weights are and rolls back
with the model when a round fails; its ``generation`` buffer tags which of the server's hypernetworks generated
theta_i, so the server can tell a delta from its current hypernetwork from a stale one (a client that failed to load
the last generation). BatchNorm running statistics are not generated: they stay on the client.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["Anchored", "GENERATION"]

#: The key of the generation tag in what an :class:`Anchored` sends and receives.
GENERATION = "generation"


class _Start(nn.Module):
    """Holds one buffer per parameter of the wrapped model, named with ``/`` for ``.`` (a buffer's name has no dots)."""


class Anchored(nn.Module):
    """``model`` (kept as ``self.model``; ``forward`` is its: ``x [B, C, H, W]`` -> logits ``[B, M]``) with the
    parameters it last loaded (``start.*``, float buffers of the parameters' shapes) and their generation
    (``generation``, float ``[1]``; -1 until weights are loaded).

    What it uploads (:meth:`weights_to_send`, called by :func:`~cosmos_pl.models.personal.shared_weights`):
    ``{"model.<param>": start - current}`` (theta_i - theta~_i, ``[*shape]`` each) and ``{"generation": [1]}``.
    What it downloads (:meth:`receive_weights`): ``{"model.<param>": theta_i, "generation": [1]}``.

    Args:
        model: the client's backbone.
    """

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        self.start = _Start()
        for name, p in model.named_parameters():
            self.start.register_buffer(name.replace(".", "/"), p.detach().clone())
        self.register_buffer(GENERATION, torch.full((1,), -1.0))
        if hasattr(model, "backbone_name"):
            self.backbone_name = model.backbone_name

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)

    def predictor(self) -> nn.Module:
        """The backbone the client predicts with (:func:`~cosmos_pl.models.personal.personal_model`: its size is
        the client's model size, and the round-0 cache holds its state, shared with FedAvg's)."""
        return self.model

    def _pairs(self) -> list[tuple[str, nn.Parameter, torch.Tensor]]:
        """``(key as sent, parameter, its start buffer)`` for every parameter of the model, in its order."""
        return [(f"model.{name}", p, self.start.get_buffer(name.replace(".", "/")))
                for name, p in self.model.named_parameters()]

    def weights_to_send(self) -> dict[str, torch.Tensor]:
        """``{"model.<param>": start - current, "generation": [1]}``: the change since the last load (detached
        copies, contiguous)."""
        out = {key: (start - p.detach()).contiguous() for key, p, start in self._pairs()}
        out[GENERATION] = self.generation.detach().clone()
        return out

    @torch.no_grad()
    def receive_weights(self, state: dict[str, torch.Tensor]) -> None:
        """Load generated parameters (keys ``model.<param>``) into the model and into ``start``, and the
        ``generation`` tag.

        Raises:
            RuntimeError: a parameter or the tag is missing, or a shape differs.
        """
        pairs = self._pairs()
        missing = [key for key, _, _ in pairs if key not in state] + ([] if GENERATION in state else [GENERATION])
        if missing:
            raise RuntimeError(f"Anchored: the weights received lack {missing[:3]}")
        for key, p, start in pairs:
            value = state[key]
            if value.shape != p.shape:
                raise RuntimeError(f"Anchored: {key} has shape {tuple(value.shape)}, the model {tuple(p.shape)}")
            p.copy_(value)
            start.copy_(value)
        self.generation.copy_(state[GENERATION].reshape(1))

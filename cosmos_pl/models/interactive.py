"""pFedCK's client: a personalized model that never leaves the client and an interactive model whose updates travel.

Source: J. Zhang, Y. Shi, "A Personalized Federated Learning Method Based on Clustering and Knowledge
Distillation", Electronics (MDPI) 2024. Each client holds a personalized model phi_i (``personal``: what it predicts
with and is scored by) and an interactive model omega_i (``shared``) of one architecture. The client uploads the
change of omega_i since the server's last update reached it, Delta omega_i = omega_i - omega_i^start, and loads its
cluster's mean change: omega_i <- omega_i^start + mean Delta, after which omega_i^start <- omega_i. The start
(``start.*`` buffers, ``[same shapes as shared]``) rides in the model's state dict, so a checkpoint and a rolled-back
client keep it and the server holds no memory of what each client has.

Every float entry of ``shared``'s state dict travels: parameters and BatchNorm running statistics, as the COSMOS
authors' pFedCK sends them (and as FedAvg averages them here); integer counters stay home.
"""

from __future__ import annotations

import torch
from torch import nn

from cosmos_pl.models.personal import PersonalAndGlobal

__all__ = ["PersonalAndInteractive"]


def _snapshot(model: nn.Module) -> nn.Module:
    """A module of buffers only, holding a copy of every float entry of ``model``'s state dict under the same
    dotted name (so ``start.<key>`` mirrors ``shared.<key>``)."""
    root = nn.Module()
    for key, value in model.state_dict().items():
        if not value.is_floating_point():
            continue
        *path, leaf = key.split(".")
        node = root
        for part in path:
            if part not in node._modules:
                node.add_module(part, nn.Module())
            node = node._modules[part]
        node.register_buffer(leaf, value.detach().clone())
    return root


class PersonalAndInteractive(PersonalAndGlobal):
    """A client's personalized model ``personal`` (phi_i) and interactive model ``shared`` (omega_i), both built
    from ``model`` (``shared`` a deep copy: they start equal), and ``start``, omega_i as the server last set it (at
    construction: its initialization). ``forward`` is ``personal``'s: ``x`` ``[B, C, H, W]`` -> logits ``[B, M]``.
    As a :class:`~cosmos_pl.models.personal.PersonalAndGlobal`, round 0's local training trains ``personal`` alone,
    so every client's omega_i stays at the shared initialization until the first mutual distillation.

    Args:
        model: the client's backbone (it becomes ``personal``).
    """

    def __init__(self, model: nn.Module) -> None:
        super().__init__(model)
        self.start = _snapshot(self.shared)

    def _pairs(self) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
        """``(key of shared's state dict, omega entry, start entry)`` for every float entry of ``shared``."""
        starts = self.start.state_dict(keep_vars=True)
        return [(k, v, starts[k]) for k, v in self.shared.state_dict(keep_vars=True).items() if k in starts]

    def weights_to_send(self) -> dict[str, torch.Tensor]:
        """Delta omega_i: ``{"shared.<key>": omega - start}`` for every float entry of ``shared`` (float32, the
        entries' shapes)."""
        return {f"shared.{k}": w.detach() - s for k, w, s in self._pairs()}

    def receive_weights(self, state: dict[str, torch.Tensor]) -> None:
        """Apply the server's update ``state`` (keyed ``shared.<key>``, as :meth:`weights_to_send` sends them; the
        cluster's mean Delta omega): ``omega <- start + state``, then ``start <- omega``.

        Raises:
            RuntimeError: a key outside ``shared``, a float entry of ``shared`` missing, or a shape that differs.
        """
        pairs = self._pairs()
        expected = {f"shared.{k}" for k, _, _ in pairs}
        if set(state) != expected:
            odd = sorted(set(state) ^ expected)[:3]
            raise RuntimeError(f"PersonalAndInteractive: the update must hold every float entry of shared.*, keyed "
                               f"as sent; these differ: {odd}")
        with torch.no_grad():
            for k, w, s in pairs:
                delta = state[f"shared.{k}"]
                if delta.shape != w.shape:
                    raise RuntimeError(f"PersonalAndInteractive: shared.{k} has shape {tuple(w.shape)}, the update "
                                       f"{tuple(delta.shape)}")
                w.copy_(s + delta.to(device=s.device, dtype=s.dtype))
                s.copy_(w)
        self.global_started.fill_(1)

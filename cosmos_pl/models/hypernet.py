"""pFedHN's hypernetwork: a learned embedding per client, an MLP, and one linear head per parameter of the target model.

Source: A. Shamsian, A. Navon, E. Fetaya, G. Chechik, "Personalized Federated Learning using Hypernetworks", ICML
2021 (arXiv 2103.04628), Section 3 and Algorithm 1; the layout is the official code's ``CNNHyper``
(``AvivSham/pFedHN`` ``experiments/pfedhn/models.py``): ``Embedding(N, d)`` -> ``Linear(d, hidden)`` ->
``hidden_layers`` x [ReLU, ``Linear(hidden, hidden)``] -> one ``Linear(hidden, numel)`` head per target tensor, every
layer with PyTorch's default initialization. :func:`hypernet_step` is the server's update
``phi <- phi - lr * J_phi(theta_i)^T (theta_i - theta~_i)`` (the official ``torch.autograd.grad`` with
``grad_outputs = delta_theta``). :func:`hypernet_size` counts its parameters without building it, for the memory check.
"""

from __future__ import annotations

import math
from typing import Literal, Optional

import torch
from torch import nn

__all__ = ["HyperNetwork", "auto_embed_dim", "hypernet_size", "hypernet_step", "hypernet_optimizer"]


def auto_embed_dim(num_clients: int, embed_dim: int) -> int:
    """The embedding size: ``embed_dim``, or for -1 the official code's ``int(1 + N / 4)`` (13 at N = 50; 1 at N = 1,
    never 0)."""
    return int(1 + num_clients / 4) if embed_dim == -1 else embed_dim


def hypernet_size(shapes: dict[str, tuple[int, ...]], num_clients: int, embed_dim: int, hidden_dim: int,
                  hidden_layers: int) -> int:
    """Parameters of a :class:`HyperNetwork` for target tensors of ``shapes`` (``embed_dim`` already resolved):
    ``N d + (d + 1) h + L (h + 1) h + sum_t (h + 1) numel_t``, about ``(h + 1) |theta|`` (101 x |theta| at h = 100)."""
    d, h = embed_dim, hidden_dim
    heads = sum((h + 1) * math.prod(s) for s in shapes.values())
    return num_clients * d + (d + 1) * h + hidden_layers * (h + 1) * h + heads


class HyperNetwork(nn.Module):
    """h(v_i; phi): client ids -> the target model's parameters.

    Args:
        shapes: the generated tensors, by name (e.g. ``"model.conv1.weight"``) -> shape, in the target's order.
        num_clients: N, rows of the embedding table.
        embed_dim: d >= 1 (resolve -1 with :func:`auto_embed_dim` first).
        hidden_dim: the MLP's width (official: 100).
        hidden_layers: the [ReLU, Linear(hidden, hidden)] blocks after the first Linear (official CLI: 3).
    """

    def __init__(self, shapes: dict[str, tuple[int, ...]], num_clients: int, embed_dim: int, hidden_dim: int = 100,
                 hidden_layers: int = 3) -> None:
        super().__init__()
        self.names = list(shapes)
        self.shapes = {k: tuple(v) for k, v in shapes.items()}
        self.embeddings = nn.Embedding(num_clients, embed_dim)
        layers: list[nn.Module] = [nn.Linear(embed_dim, hidden_dim)]
        for _ in range(hidden_layers):
            layers += [nn.ReLU(), nn.Linear(hidden_dim, hidden_dim)]
        self.mlp = nn.Sequential(*layers)
        self.heads = nn.ModuleList(nn.Linear(hidden_dim, math.prod(self.shapes[k])) for k in self.names)

    def features(self, ids: torch.Tensor) -> torch.Tensor:
        """f(v): the MLP's output for client ids int64 ``[B]`` -> ``[B, hidden]`` (no ReLU after the last Linear,
        as the official ``CNNHyper``)."""
        return self.mlp(self.embeddings(ids))

    def forward(self, ids: torch.Tensor) -> dict[str, torch.Tensor]:
        """Client ids int64 ``[B]`` -> ``{name: [B, *shape]}``, every client's generated tensors in one matmul per
        head."""
        f = self.features(ids)
        return {k: head(f).view(len(ids), *self.shapes[k]) for k, head in zip(self.names, self.heads)}


def hypernet_optimizer(hn: nn.Module, lr: float, embed_lr: Optional[float], momentum: float,
                       weight_decay: float) -> torch.optim.SGD:
    """The official outer optimizer: SGD with two groups, the parameters whose name holds ``embed`` at ``embed_lr``
    (None: ``lr``), the rest at ``lr``, both with ``momentum`` and ``weight_decay``."""
    named = list(hn.named_parameters())
    groups = [{"params": [p for n, p in named if "embed" not in n]},
              {"params": [p for n, p in named if "embed" in n], "lr": lr if embed_lr is None else embed_lr}]
    return torch.optim.SGD(groups, lr=lr, momentum=momentum, weight_decay=weight_decay)


def _one_step(hn: nn.Module, optimizer: torch.optim.Optimizer, ids: list[int], deltas: list[dict[str, torch.Tensor]],
              clip: float) -> None:
    """One optimizer step on ``(1 / len(ids)) sum_i J_phi(h(v_i))^T delta_i`` at the current phi; the gradient's norm
    clipped to ``clip`` (0: no clipping)."""
    params = [p for p in hn.parameters()]
    device = params[0].device
    out = hn(torch.tensor(ids, dtype=torch.long, device=device))
    names = list(out)
    grad_outputs = [torch.stack([d[k].to(device, torch.float32) for d in deltas]).reshape(out[k].shape) / len(ids)
                    for k in names]
    grads = torch.autograd.grad([out[k] for k in names], params, grad_outputs=grad_outputs, allow_unused=True)
    optimizer.zero_grad(set_to_none=True)
    for p, g in zip(params, grads):
        p.grad = torch.zeros_like(p) if g is None else g
    if clip > 0:
        torch.nn.utils.clip_grad_norm_(params, clip)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def hypernet_step(hn: nn.Module, optimizer: torch.optim.Optimizer, deltas: dict[int, dict[str, torch.Tensor]], *,
                  update: Literal["sequential", "mean"] = "sequential", clip: float = 50.0) -> None:
    """The server's update of the hypernetwork ``hn`` (``ids [B] -> {name: [B, *shape]}``) from the clients' uploads.

    ``deltas``: client id -> ``{name: theta_i - theta~_i}`` (each the shape of one generated tensor: what the client
    was sent minus what it trained). Descending on ``J^T (theta - theta~)`` moves h(v_i) toward theta~_i (paper,
    Algorithm 1; the official ``grad_outputs = delta_theta`` with ``delta_theta = inner_state - final_state``).

    Args:
        hn: the hypernetwork, updated in place.
        optimizer: its optimizer (:func:`hypernet_optimizer`).
        deltas: the accepted uploads, by client id.
        update: ``"sequential"``: one optimizer step per client in id order, each at the phi the previous steps left
            (the official loop's one client per step); ``"mean"``: one step on the mean of the clients' gradients.
        clip: the gradient's norm is clipped to this (official: 50; 0: no clipping).
    """
    ids = sorted(deltas)
    if not ids:
        return
    with torch.enable_grad():
        if update == "sequential":
            for i in ids:
                _one_step(hn, optimizer, [i], [deltas[i]], clip)
        else:
            _one_step(hn, optimizer, ids, [deltas[i] for i in ids], clip)

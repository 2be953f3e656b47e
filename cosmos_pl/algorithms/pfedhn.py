"""pFedHN: a hypernetwork on the server generates every client's weights from a learned client embedding
(homogeneous clients only).

Source: A. Shamsian, A. Navon, E. Fetaya, G. Chechik, "Personalized Federated Learning using Hypernetworks", ICML
2021 (arXiv 2103.04628), Section 3 and Algorithm 1; where the paper gives no value, the official code's
(``AvivSham/pFedHN`` ``experiments/pfedhn/trainer.py`` and ``models.py``, named "official" below). Each round:
1. every client holds theta_i = h(v_i; phi), generated and loaded at the end of the previous round, and trains it
   for ``inner_steps`` SGD steps to theta~_i (:class:`~cosmos_pl.objectives.hn_inner.PFedHNFit`);
2. it uploads ``theta_i - theta~_i`` and the generation tag of theta_i
   (:class:`~cosmos_pl.models.anchored.Anchored`);
3. the server steps phi (the embeddings, the MLP and the heads) by ``J_phi(theta_i)^T (theta_i - theta~_i)``
   (:func:`~cosmos_pl.models.hypernet.hypernet_step`), then generates theta_i for every client, which each loads.

Round 1 trains the clients' round-0 models, which no hypernetwork generated: their uploads carry generation -1 and
are not used, so the first round's server step only generates. Later, an upload tagged with an older generation than
the server's (a client that failed to load the last weights and rolled back) is skipped and logged.

Defaults (official unless said): ``embed_dim`` -1 -> ``int(1 + N / 4)``; ``hidden_dim`` 100; ``hidden_layers`` 3
(the CLI's ``--n-hidden``; the class default is 1); ``hn_lr`` 1e-2 and ``embed_lr`` null (= ``hn_lr``); outer SGD
momentum 0.9, weight decay 1e-3; gradient clip 50 on both loops; ``inner_steps`` 50 with SGD lr 5e-3, momentum 0.9,
weight decay 5e-5, a fresh inner optimizer each round. Batches: ``clients.batch_size`` (official 64). The official
loop samples one client per step; here a round's clients all train from the same phi and ``update: sequential``
applies one outer step per client in id order (each at the phi the previous ones left), ``mean`` one step on the
mean of their gradients.

Memory: the heads alone hold ``(hidden_dim + 1) |theta|`` parameters (about 101 x the target model). The
hypernetwork, its gradient and momentum and the clients' generated weights are estimated before round 0 against
the free memory of the device the server step runs on (the process's device: its current GPU when the trainer runs
on CUDA, the one the sequential executor trains teachers on, else the CPU), and a run that does not fit is refused
in one line naming the size and a smaller backbone.

Scored model: the client model f_i right after loading theta_i = h(v_i; phi) (the official ``eval_model``), with the
client's own BatchNorm running statistics (not generated). Bytes: theta_i's float32 parameters down, their change up.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Callable, Literal, Optional

import torch
from torch import nn

from cosmos_pl.algorithms.base import Algorithm, ServerResult, check_setting
from cosmos_pl.algorithms.fedavg import global_model_receivers, require_one_backbone
from cosmos_pl.errors import ConfigError
from cosmos_pl.limits import memory_available
from cosmos_pl.models.anchored import GENERATION, Anchored
from cosmos_pl.models.hypernet import (HyperNetwork, auto_embed_dim, hypernet_optimizer, hypernet_size,
                                       hypernet_step)
from cosmos_pl.training.config import register_stage, resolve_device

if TYPE_CHECKING:
    from cosmos_pl.algorithms.base import Step

__all__ = ["PFedHN", "check_hypernet_memory", "free_memory", "hypernet_bytes", "SMALLER_BACKBONES"]

register_stage("hypernet", 12)  # seeds the hypernetwork's initial weights

#: Backbones suggested, largest first, when a hypernetwork does not fit: the first smaller one that fits is named.
SMALLER_BACKBONES = ("mobilenetv2_100", "squeezenet1_1", "lcnet_050", "lcnet_035", "test_efficientnet")


def hypernet_bytes(hn_parameters: int, target_parameters: int, num_clients: int) -> int:
    """float32 bytes the server step needs, with a 10% margin: the hypernetwork, its gradient, its momentum and the
    gradient's copy the SGD step makes for weight decay (4 x ``hn_parameters``), and theta for every client plus one
    generated with its graph (``(num_clients + 1) x target_parameters``). One outer step and one generation of a
    202 M-parameter hypernetwork (5 clients) peaked at 3.8 x its size above the memory in use before."""
    return int(1.1 * 4 * (4 * hn_parameters + (num_clients + 1) * target_parameters))


def free_memory(device: torch.device) -> Optional[int]:
    """Free bytes on ``device``: ``torch.cuda.mem_get_info`` on a GPU, ``MemAvailable`` of ``/proc/meminfo`` on
    the CPU; None where unknown."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    return memory_available()


def _millions(n: int) -> str:
    return f"{n / 1e9:.2f} B" if n >= 1e9 else f"{n / 1e6:.2f} M"


def check_hypernet_memory(backbone: str, target_parameters: int, hn_parameters: int, need: int,
                          free: Optional[int], where: str, smaller: Callable[[], Optional[tuple[str, int]]],
                          hidden_dim: int) -> None:
    """Refuse, in one line, a hypernetwork that does not fit the device it runs on.

    Args:
        backbone: the clients' backbone.
        target_parameters: |theta|, its parameters.
        hn_parameters: the hypernetwork's parameters.
        need: bytes the server step needs (:func:`hypernet_bytes`).
        free: free bytes of the device (None: unknown, no check).
        where: the device in words (``"cpu"``, ``"cuda:0"``).
        smaller: called only when it does not fit: ``(name, |theta|)`` of a smaller backbone that fits, or None.
        hidden_dim: the hypernetwork's width, named as the other setting to lower.

    Raises:
        ConfigError: ``need > free``, naming the sizes, a smaller backbone and ``algorithm.init_args.hidden_dim``.
    """
    if free is None or need <= free:
        return
    gib = 2 ** 30
    other = smaller()
    lower = f"lower algorithm.init_args.hidden_dim (now {hidden_dim})"
    fix = (f"use a smaller backbone (clients.backbones: [{other[0]}], |theta| = {_millions(other[1])}), or {lower}"
           if other else f"{lower}: no smaller backbone of {', '.join(SMALLER_BACKBONES)} fits either")
    raise ConfigError(f"algorithm pfedhn: the hypernetwork for backbone {backbone} (|theta| = "
                      f"{_millions(target_parameters)} parameters) has {_millions(hn_parameters)} parameters and needs "
                      f"about {need / gib:.1f} GiB with its gradient, momentum and the generated weights, and {where} "
                      f"has {free / gib:.1f} GiB free: {fix}")


def _to_cpu(value: Any) -> Any:
    """``value`` with every tensor in it (nested dicts and lists) on the CPU."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, dict):
        return {k: _to_cpu(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_to_cpu(v) for v in value)
    return value


class PFedHN(Algorithm):
    """A server hypernetwork generates each client's weights; clients train them and return the change.

    Args:
        inner_steps: the clients' SGD steps per round (official 50); null: ``clients.local_epochs`` epochs of
            cross-entropy with ``clients.optimizer`` instead (FL-bench's inner loop), the ``inner_*`` values unused.
        inner_lr: the inner SGD's learning rate (official 5e-3).
        inner_momentum: the inner SGD's momentum (official 0.9).
        inner_weight_decay: the inner SGD's weight decay (official 5e-5).
        inner_clip: the inner gradient's norm is clipped to this (official 50; 0: no clipping).
        embed_dim: the client embedding's size; -1: ``int(1 + N / 4)`` (official).
        hidden_dim: the hypernetwork MLP's width (official 100).
        hidden_layers: [ReLU, Linear] blocks after the MLP's first Linear (official CLI 3).
        hn_lr: the outer SGD's learning rate (official 1e-2).
        embed_lr: the embeddings' learning rate; null: ``hn_lr`` (official).
        hn_momentum: the outer SGD's momentum (official 0.9).
        hn_weight_decay: the outer SGD's weight decay (official 1e-3).
        clip: the outer gradient's norm is clipped to this (official 50; 0: no clipping).
        update: ``sequential``: one outer step per client in id order (the official one client per step);
            ``mean``: one step on the mean of the round's clients' gradients.
    """

    name = "pfedhn"
    shared_init = True
    uses_public = False

    def __init__(self, inner_steps: Optional[int] = 50, inner_lr: float = 5e-3, inner_momentum: float = 0.9,
                 inner_weight_decay: float = 5e-5, inner_clip: float = 50.0, embed_dim: int = -1,
                 hidden_dim: int = 100, hidden_layers: int = 3, hn_lr: float = 1e-2, embed_lr: Optional[float] = None,
                 hn_momentum: float = 0.9, hn_weight_decay: float = 1e-3, clip: float = 50.0,
                 update: Literal["sequential", "mean"] = "sequential") -> None:
        check_setting("inner_steps", inner_steps, inner_steps is None or inner_steps >= 0, ">= 0 or null")
        for key, value in (("inner_lr", inner_lr), ("hn_lr", hn_lr)):
            check_setting(key, value, math.isfinite(value) and value > 0, "finite and > 0")
        check_setting("embed_lr", embed_lr, embed_lr is None or (math.isfinite(embed_lr) and embed_lr > 0),
                      "finite and > 0, or null (hn_lr)")
        for key, value in (("inner_momentum", inner_momentum), ("hn_momentum", hn_momentum)):
            check_setting(key, value, 0 <= value < 1, "in [0, 1)")
        for key, value in (("inner_weight_decay", inner_weight_decay), ("hn_weight_decay", hn_weight_decay),
                           ("inner_clip", inner_clip), ("clip", clip)):
            check_setting(key, value, math.isfinite(value) and value >= 0, "finite and >= 0 (0: off)")
        check_setting("embed_dim", embed_dim, embed_dim == -1 or embed_dim >= 1, ">= 1, or -1 (int(1 + N / 4))")
        check_setting("hidden_dim", hidden_dim, hidden_dim >= 1, ">= 1")
        check_setting("hidden_layers", hidden_layers, hidden_layers >= 0, ">= 0")
        check_setting("update", update, update in ("sequential", "mean"), "sequential or mean")
        self.inner_steps, self.inner_lr, self.inner_momentum = inner_steps, inner_lr, inner_momentum
        self.inner_weight_decay, self.inner_clip = inner_weight_decay, inner_clip
        self.embed_dim, self.hidden_dim, self.hidden_layers = embed_dim, hidden_dim, hidden_layers
        self.hn_lr, self.embed_lr, self.hn_momentum, self.hn_weight_decay = hn_lr, embed_lr, hn_momentum, \
            hn_weight_decay
        self.clip, self.update = clip, update

    def validate(self, backbones: list[str]) -> None:
        require_one_backbone("pFedHN", backbones, "generates every client's parameters with one hypernetwork")

    def client_model(self, model: nn.Module) -> nn.Module:
        return Anchored(model)

    def _shapes(self, backbone: str) -> dict[str, tuple[int, ...]]:
        """The generated tensors of ``backbone``: the client model's parameters, keyed as it sends them."""
        with torch.random.fork_rng(devices=[]):  # CPU only: the run's random draws are left as they are
            model = Anchored(self.ctx.make_backbone(backbone, 0))
        return {f"model.{k}": tuple(p.shape) for k, p in model.model.named_parameters()}

    def _size(self, shapes: dict[str, tuple[int, ...]]) -> tuple[int, int, int]:
        """``(|theta|, hypernetwork parameters, bytes needed)`` for target tensors of ``shapes``."""
        n = self.ctx.num_clients
        theta = sum(math.prod(s) for s in shapes.values())
        hn = hypernet_size(shapes, n, auto_embed_dim(n, self.embed_dim), self.hidden_dim, self.hidden_layers)
        return theta, hn, hypernet_bytes(hn, theta, n)

    def _smaller(self, theta: int, free: int) -> Optional[tuple[str, int]]:
        """The first of :data:`SMALLER_BACKBONES` with fewer parameters than ``theta`` whose hypernetwork fits."""
        for name in SMALLER_BACKBONES:
            small, _, need = self._size(self._shapes(name))
            if small < theta and need <= free:
                return name, small
        return None

    def setup(self, ctx) -> None:
        """Check the hypernetwork fits its device, then build it (seeded by the "hypernet" stage) and its optimizer.

        Raises:
            ConfigError: it does not fit (:func:`check_hypernet_memory`).
        """
        super().setup(ctx)
        self.device = resolve_device(ctx.trainer.accelerator)
        backbone = ctx.backbones[0]
        shapes = self._shapes(backbone)
        theta, hn_parameters, need = self._size(shapes)
        free = free_memory(self.device)
        check_hypernet_memory(backbone, theta, hn_parameters, need, free, str(self.device),
                              lambda: self._smaller(theta, free or 0), self.hidden_dim)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(ctx.stage_seed(0, "hypernet", 0))
            self.hypernet = HyperNetwork(shapes, ctx.num_clients, auto_embed_dim(ctx.num_clients, self.embed_dim),
                                         self.hidden_dim, self.hidden_layers).to(self.device)
        self.optimizer = hypernet_optimizer(self.hypernet, self.hn_lr, self.embed_lr, self.hn_momentum,
                                            self.hn_weight_decay)
        self.theta_bytes = 4 * theta
        self.generation = 0  # theta generated so far; what the clients hold is tagged with it
        ctx.log(f"pfedhn: hypernetwork of {_millions(hn_parameters)} parameters for {backbone} (|theta| = "
                f"{_millions(theta)}) on {self.device}")

    def plan(self, rnd: int) -> list[Step]:
        from cosmos_pl.objectives.hn_inner import PFedHNFit
        from cosmos_pl.objectives.local_fit import LocalFit
        from cosmos_pl.objectives.protocol import LoadWeights, Upload

        inner = (LocalFit(self.ctx.local_epochs) if self.inner_steps is None else
                 PFedHNFit(self.inner_steps, self.inner_lr, self.inner_momentum, self.inner_weight_decay,
                           self.inner_clip))
        return [inner, Upload("weights"), LoadWeights()]

    def weight_receivers(self, served: list[int], sampled: list[int], targets: dict[int, Any]) -> list[int]:
        return global_model_receivers(served, sampled, targets)  # every client holds the newest generation

    def upload_bytes(self, client: int, state: dict[str, torch.Tensor]) -> int:
        """The change of the parameters, float32 (the generation tag is not counted)."""
        return sum(v.numel() * v.element_size() for k, v in state.items() if k != GENERATION)

    def server_step(self, rnd: int, uploads: dict[int, Any]) -> ServerResult:
        fresh = {i: s for i, s in uploads.items() if int(s[GENERATION].reshape(-1)[0]) == self.generation}
        stale = sorted(set(uploads) - set(fresh))
        if stale and self.generation > 0:
            self.ctx.log(f"round {rnd}: pfedhn skips the uploads of clients {stale}: they trained weights of an "
                         f"earlier hypernetwork (they did not load generation {self.generation})")
        deltas = {i: {k: v for k, v in s.items() if k != GENERATION} for i, s in fresh.items()}
        hypernet_step(self.hypernet, self.optimizer, deltas, update=self.update, clip=self.clip)
        self.generation += 1
        return ServerResult(self.generate(), self.theta_bytes)

    @torch.no_grad()
    def generate(self) -> dict[int, dict[str, torch.Tensor]]:
        """theta_i = h(v_i; phi) for every client, float32 on the CPU, with the current generation tag."""
        n = self.ctx.num_clients
        out = self.hypernet(torch.arange(n, device=self.device))
        tag = torch.tensor([float(self.generation)])
        return {i: {**{k: v[i].cpu().contiguous() for k, v in out.items()}, GENERATION: tag.clone()}
                for i in range(n)}

    def state_dict(self) -> dict[str, Any]:
        return {"hypernet": _to_cpu(self.hypernet.state_dict()), "optimizer": _to_cpu(self.optimizer.state_dict()),
                "generation": self.generation}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.hypernet.load_state_dict(state["hypernet"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.generation = int(state["generation"])

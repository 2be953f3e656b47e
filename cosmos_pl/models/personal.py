"""A client that keeps two models of one architecture: its personalized model and its copy of the global model.

Ditto (Li et al., ICML 2021) and FedBABU (Oh et al., ICLR 2022) train a global model by parameter averaging and
score a personalized one. :class:`PersonalAndGlobal` holds both on the client: ``personal`` (v_i, what the client
predicts with and is scored by) and ``shared`` (its local copy of the global model w, what it trains for the
average and uploads). Only ``shared``'s tensors travel (:func:`shared_weights`); with ``share_head=False``
(FedBABU) the classifier head of ``shared`` is frozen at its initialization and stays home, so the body alone is
averaged.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

__all__ = ["PersonalAndGlobal", "head_name", "shared_weights", "load_shared_weights", "personal_model"]


def head_name(model: nn.Module) -> str:
    """The dotted name of ``model``'s classifier head: timm's ``get_classifier()`` where the model has one, else
    the last submodule that holds parameters of its own (torchvision's AlexNet ``classifier.6``, SqueezeNet
    ``classifier.1``).

    Raises:
        ValueError: the model has no parameters.
    """
    get = getattr(model, "get_classifier", None)
    if callable(get):
        head = get()
        for name, module in model.named_modules():
            if module is head and name and any(True for _ in head.parameters()):
                return name
    last = None
    for name, module in model.named_modules():
        if name and any(True for _ in module.parameters(recurse=False)):
            last = name
    if last is None:
        raise ValueError(f"{type(model).__name__} has no parameters, so no classifier head")
    return last


class PersonalAndGlobal(nn.Module):
    """A client's personalized model ``personal`` and its copy of the global model ``shared``, both built from
    ``model`` (``shared`` a deep copy: they start equal). ``forward`` is ``personal``'s: ``x`` ``[B, C, H, W]`` ->
    logits ``[B, M]``.

    Args:
        model: the client's backbone (it becomes ``personal``).
        share_head: whether ``shared``'s classifier head (:func:`head_name`) is trained and uploaded; ``False``
            (FedBABU) freezes it (``requires_grad=False``) and keeps it out of :func:`shared_weights`.
    """

    def __init__(self, model: nn.Module, share_head: bool = True) -> None:
        super().__init__()
        self.personal = model
        self.shared = copy.deepcopy(model)
        self.share_head = share_head
        self.head = head_name(model)
        # 1 once ``shared`` holds a global model (its round-0 start or a server average); an integer buffer, so it
        # is checkpointed with the model and never averaged or sent
        self.register_buffer("global_started", torch.zeros((), dtype=torch.long))
        if hasattr(model, "backbone_name"):
            self.backbone_name = model.backbone_name
        if not share_head:
            for p in self.shared.get_submodule(self.head).parameters():
                p.requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.personal(x)

    def load_global(self, state: dict[str, torch.Tensor]) -> None:
        """Load the server's average (keys ``shared.*``, as :func:`shared_weights` sends them) into ``shared``.

        Raises:
            RuntimeError: a key outside ``shared`` or a shape that differs."""
        if any(not k.startswith("shared.") for k in state):
            raise RuntimeError(f"PersonalAndGlobal: global weights must be keyed shared.*, got {sorted(state)[:3]}")
        self.load_state_dict(state, strict=False)
        self.global_started.fill_(1)

    def is_head(self, key: str) -> bool:
        """Whether ``key`` (a key of ``shared``'s state dict) belongs to the classifier head."""
        return key == self.head or key.startswith(self.head + ".")


def shared_weights(model: nn.Module) -> dict[str, torch.Tensor]:
    """The tensors a client sends for a weights upload, detached copies keyed as in ``model``'s state dict:
    every float tensor of a plain model (FedAvg), ``shared.*`` of a :class:`PersonalAndGlobal` (Ditto), without the
    head when it is not shared (FedBABU: the body alone). A model with its own ``weights_to_send()`` method (a
    wrapper that sends deltas or masks) sends what that returns."""
    own = getattr(model, "weights_to_send", None)
    if callable(own):
        return own()
    state = model.state_dict()
    if not isinstance(model, PersonalAndGlobal):
        return {k: v.detach().clone() for k, v in state.items() if v.is_floating_point()}
    return {k: v.detach().clone() for k, v in state.items()
            if k.startswith("shared.") and v.is_floating_point() and (model.share_head or not model.is_head(k[7:]))}


def load_shared_weights(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Load the server's averaged weights (keyed as :func:`shared_weights` sends them) into ``model``: the whole of a
    plain model's float tensors (FedAvg), or the copy of the global model of a :class:`PersonalAndGlobal`. A model
    with its own ``receive_weights(state)`` method loads them that way."""
    own = getattr(model, "receive_weights", None)
    if callable(own):
        own(state)
    elif isinstance(model, PersonalAndGlobal):
        model.load_global(state)
    else:
        model.load_state_dict(state, strict=False)


def personal_model(model: nn.Module) -> nn.Module:
    """The model a client predicts with: ``personal`` of a :class:`PersonalAndGlobal`, what a wrapper's own
    ``predictor()`` method returns (pFedHN's :class:`~cosmos_pl.models.anchored.Anchored` and FedSelect's
    :class:`~cosmos_pl.models.selective.Selective`: the backbone they wrap), else ``model`` itself (its size is the
    model size a client reports; the round-0 cache holds its weights)."""
    own = getattr(model, "predictor", None)
    if callable(own):
        return own()
    return model.personal if isinstance(model, PersonalAndGlobal) else model

"""The interface every federated algorithm implements, and the client steps a round is made of.

One runner loop (:class:`cosmos_pl.federated.runner.Runner`) owns round 0, uploads and their encoding,
the executor, evaluation and the records. An algorithm only says, per round, which client steps run
(:meth:`Algorithm.plan`), turns the uploads it received into per-client targets (:meth:`Algorithm.server_step`),
names the models scored for each client (:meth:`Algorithm.eval_models`) and keeps its own state
(:meth:`Algorithm.state_dict`). This follows Flower's configure/aggregate split and FL-bench's small
per-method classes.

A round is an ordered list of steps (:mod:`cosmos_pl.objectives`: one module per client objective; an algorithm
imports its steps in :meth:`Algorithm.plan`, so its settings are parsed without Lightning). At most one
:class:`~cosmos_pl.objectives.protocol.Upload` appears; the server step runs right after
it, and every later step that needs targets reads the ones it returned. A client without a target (it did
not upload, or it belongs to no cluster yet) skips those steps this round.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Literal, Optional, Union

import torch
from torch import nn

from cosmos_pl.errors import check

if TYPE_CHECKING:  # the steps of a plan live with their objectives (cosmos_pl.objectives), which import Lightning
    from cosmos_pl.objectives.protocol import LoadWeights, Upload
    from cosmos_pl.objectives.step import ClientStep

    Step = Union[ClientStep, Upload, LoadWeights]

__all__ = ["Algorithm", "FederationContext", "ServerResult", "check_setting"]


# --------------------------------------------------------------------------- what the runner gives
@dataclass
class FederationContext:
    """What an algorithm may know and use; handed to :meth:`Algorithm.setup` by the runner.

    It never holds U's labels, clients' data or true group ids (a server in a deployment has none of them).

    Attributes:
        num_clients: N.
        num_classes: M.
        public: U, uint8 ``[n, C, H, W]`` (inputs only).
        backbones: each client's architecture name, ``[N]``.
        client_sizes: |D_i| per client, ``[N]`` (FedAvg weights its average by them).
        seed: the experiment seed.
        stage_seed: ``(round, stage, id) -> int``, the seed of one stage (see ``cosmos_pl.training.config.stage_seed``).
        make_backbone: ``(name, seed) -> nn.Module``, a Kaiming-initialized backbone for this data.
        run_tasks: ``(round, stage, tasks, costs, trains) -> [(model, output)]``: runs independent training
            or inference tasks on the executor (timed, shown in the progress display).
        trainer: the ``TrainerConfig`` every stage uses.
        transformations: T and d (augmentation and the views of r_B).
        local_epochs: the clients' epochs on D_i per round (``clients.local_epochs``).
        distill_epochs: the clients' epochs on U per round (``clients.distill_epochs``).
        log: prints one line to the console.
    """

    num_clients: int
    num_classes: int
    public: torch.Tensor
    backbones: list[str]
    client_sizes: list[int]
    seed: int
    stage_seed: Callable[[int, str, int], int]
    make_backbone: Callable[[str, int], nn.Module]
    run_tasks: Callable[..., list[tuple[Any, Any]]]
    trainer: Any
    transformations: Any
    local_epochs: int = 1
    distill_epochs: int = 1
    log: Callable[[str], None] = print


@dataclass
class ServerResult:
    """What a server step returns.

    Attributes:
        targets: per client id, what it downloads: pseudo-labels ``[n, M]`` (rows on the simplex; one-hot for
            hard labels) or a state dict (FedAvg). Clients without an entry skip the target steps.
        download_bytes: bytes one client downloads this round (exact size of what is sent).
        losses: per-stage training losses of server models this round, ``{name: value}`` (e.g. teacher KL).
    """

    targets: dict[int, Any]
    download_bytes: int
    losses: dict[str, float] = field(default_factory=dict)


# --------------------------------------------------------------------------- the interface
class Algorithm:
    """A federated algorithm over heterogeneous clients; subclasses are chosen in the config by class path.

    Subclasses set ``name`` (the short name ``cosmos-pl compare`` uses), ``scored`` (which model's accuracy
    is the headline personalized accuracy: ``"teacher"`` for COSMOS's h_pi(i), ``"client"`` for f_i),
    ``shared_init`` (every client starts from the same initial weights, as parameter averaging needs) and
    ``uses_public`` (clients send something computed on U, so U must not be empty: ``data.public_fraction > 0``).
    Constructor arguments are checked in ``__init__`` (:func:`check_setting`), so a bad one fails when the
    config is parsed.
    """

    name: str = "algorithm"
    scored: Literal["client", "teacher"] = "client"
    shared_init: bool = False
    uses_public: bool = True

    def validate(self, backbones: list[str]) -> None:
        """Check, before any data is loaded, that clients with these backbone names suit the algorithm.

        Raises:
            ConfigError: they cannot run this algorithm (naming the setting and the fix).
        """

    def client_model(self, model: nn.Module) -> nn.Module:
        """The model a client holds, built from its backbone ``model`` (default: the backbone itself; Ditto and
        FedBABU: a :class:`~cosmos_pl.models.personal.PersonalAndGlobal`). Called wherever a client's model is built:
        the in-process clients, a Flower node, the server's reference for uploaded weights."""
        return model

    def server_backbones(self) -> dict[str, str]:
        """The architectures the server builds, by dotted setting key (COSMOS:
        ``{"algorithm.init_args.teacher_backbone": name}``); the runner tries each on the data before round 0."""
        return {}

    def setup(self, ctx: FederationContext) -> None:
        """Keep ``ctx`` (the runner calls :meth:`validate` first)."""
        self.ctx = ctx

    def phase(self, rnd: int) -> str:
        """The label of round ``rnd`` >= 1 in the records."""
        return "federated"

    def plan(self, rnd: int) -> list[Step]:
        """The client steps of round ``rnd`` >= 1, in order (epochs from ``ctx.local_epochs`` / ``ctx.distill_epochs``)."""
        raise NotImplementedError

    def server_step(self, rnd: int, uploads: dict[int, Any]) -> ServerResult:
        """Turn the uploads received this round (a subset of clients may be missing) into per-client targets.

        Args:
            rnd: the round (>= 1).
            uploads: client id -> float ``[n, M]`` decoded pseudo-labels, or a state dict for ``Upload("weights")``.
        """
        raise NotImplementedError

    def weight_receivers(self, served: list[int], sampled: list[int], targets: dict[int, Any]) -> list[int]:
        """The clients that load the server's weights at this round's
        :class:`~cosmos_pl.objectives.protocol.LoadWeights` step (default: ``served``).

        Args:
            served: the clients sampled this round that are still running and have a target, ascending.
            sampled: the clients sampled this round (every client without ``clients_per_round``), ascending.
            targets: the server step's targets by client id (:attr:`ServerResult.targets`).
        """
        return served

    def upload_bytes(self, client: int, state: dict[str, torch.Tensor]) -> int:
        """Bytes of ``client``'s accepted weights upload ``state`` as the method sends it (default: every float
        tensor, :func:`~cosmos_pl.communication.state_dict_bytes`; FedSelect: its shared entries and its mask)."""
        from cosmos_pl.communication import state_dict_bytes

        return state_dict_bytes(state)

    def eval_models(self, client: int) -> dict[str, nn.Module]:
        """Models scored for ``client`` besides its own f_i, by name (COSMOS: ``{"teacher": h_pi(i)}``)."""
        return {}

    def cluster_of(self, client: int) -> Optional[int]:
        """The client's cluster, or None for algorithms without clusters."""
        return None

    def clustering_info(self) -> Optional[dict[str, Any]]:
        """What clusters.json records (B0 or K, assignment, clusters, distances), or None."""
        return None

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue after the last completed round (tensors and plain values only)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (after :meth:`setup`)."""


def check_setting(name: str, value: Any, ok: bool, allowed: str) -> None:
    """Raise :class:`~cosmos_pl.errors.ConfigError` ``"algorithm.init_args.<name>=<value>: must be <allowed>"``
    unless ``ok``: an algorithm's constructor argument, checked when the config is parsed."""
    check(ok, f"algorithm.init_args.{name}", value, f"must be {allowed}")

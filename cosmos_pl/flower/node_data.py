"""A node's run: the settings, its own client's data (never the other clients'), U, and the node's data cache.

The server's ``query.hello`` carries the run's resolved config; the node builds the same federation as the server
(same settings and seed) and keeps only its own client's part (``partition-id`` mode), or reads its site's own folder
(``data`` mode, U as the server sent it). It keeps them in ``state-dir/data/<config hash>/client_<id>.pt``, so the
later messages of the run (each one a new ClientApp process in Flower) load them instead of rebuilding the
federation.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import torch

from cosmos_pl.data import ClientData
from cosmos_pl.errors import ConfigError
from cosmos_pl.federated.initial_models import client_backbone, initial_model
from cosmos_pl.files import atomic_save
from cosmos_pl.models import count_parameters
from cosmos_pl.models.personal import personal_model
from cosmos_pl.objectives.runtime import ClientRuntime
from cosmos_pl.uploads import public_fingerprint

__all__ = ["DATA_FIELDS", "NodeRun", "Site", "SiteDataError", "clear_runs", "load_run", "partition_part", "site_part"]

_RUNS: dict[tuple[str, int], "NodeRun"] = {}  # per process, by (config hash, client): one run at a time


@dataclass
class NodeRun:
    """What a node holds for the run: the settings, its own client's data (never the other clients'), U and the
    client runtime.

    Attributes:
        init: the run's parsed settings.
        data: the client's own data (training, test and validation splits).
        public_x: U, uint8 ``[n, C, H, W]``.
        num_clients, num_classes, in_chans, image_shape: the federation's N, M, C and (H, W).
        runtime: the settings every client step reads, and the tasks it builds (the same as in-process).
        fingerprint: U's fingerprint.
        initial_state: the client's round-0 model weights, kept in the disk cache beside its data.
    """

    config_hash: str
    init: Any
    client_id: int
    data: ClientData
    public_x: Optional[torch.Tensor]
    num_clients: int
    num_classes: int
    in_chans: int
    image_shape: tuple[int, int]
    runtime: ClientRuntime
    fingerprint: str
    initial_state: Optional[dict[str, torch.Tensor]] = None  # the round-0 model's state dict (:meth:`initial_model`)
    parameters: int = 0  # the model's parameter count

    def backbone(self, client_id: int) -> str:
        """Client ``client_id``'s architecture (:func:`~cosmos_pl.federated.initial_models.client_backbone`)."""
        return client_backbone(self.init.clients.backbones, client_id)

    def initial_model(self, client_id: int) -> torch.nn.Module:
        """The client's round-0 model, the same as the in-process clients'
        (:func:`~cosmos_pl.federated.initial_models.initial_model`)."""
        return initial_model(self.init.algorithm, self.backbone(client_id), client_id, self.init.seed,
                             self.num_classes, self.in_chans, self.image_shape)


DATA_FIELDS = ("x", "y", "x_test", "y_test", "x_val", "y_val")


@dataclass(frozen=True)
class Site:
    """A node that serves its own data (node config ``data``): its folder, and what the server said of the run.

    Attributes:
        folder: the site's data (``data.npz`` or an ImageFolder tree, :func:`cosmos_pl.data.load_site`).
        classes: the run's class list (the site's labels are mapped to it by name).
        public_shape: U's ``[n, C, H, W]`` (the site's images must have its C, H and W).
        fingerprint: U's fingerprint (the server sends U once; the node keeps it by its fingerprint).
        public_dir: where the node keeps U (``state-dir/public``).
    """

    folder: str
    classes: tuple[str, ...]
    public_shape: tuple[int, ...]
    fingerprint: str
    public_dir: Path

    @property
    def public_file(self) -> Path:
        return self.public_dir / f"{self.fingerprint}.pt"

    def public(self) -> Optional[torch.Tensor]:
        """U as the server sent it, or None when it has not arrived yet."""
        return torch.load(self.public_file, weights_only=True) if self.public_file.is_file() else None


class SiteDataError(ValueError):
    """A site's own data cannot be used for the run (an unknown class, another image size, an unreadable image):
    the client of ``client_id`` fails every round with this reason, and the run goes on with the others."""

    def __init__(self, client_id: int, reason: str) -> None:
        super().__init__(reason)
        self.client_id = client_id


def load_run(config_yaml: str, client_id: int, cache: Optional[Path] = None, site: Optional[Site] = None) -> NodeRun:
    """Parse the run's resolved config and get client ``client_id``'s data and U: from the node's disk cache
    (``cache/<config hash>/client_<id>.pt``, written atomically by the first message of the run), else from the
    site's own folder (``site``: its data; U as the server sent it), or by building the federation as the server
    does (same settings and seed) and keeping this client's part. Flower starts a process per message, so only the
    first message pays for loading the data. Kept per process too (one run at a time).

    Raises:
        ConfigError / DataError / FileNotFoundError: the config is invalid here or the data cannot be loaded.
        ConfigError: ``client_id`` is not a client of the federation (0..N-1).
        SiteDataError: the site's data cannot be used (naming the file or class).
    """
    key = hashlib.sha256((config_yaml + (site.folder if site else "")).encode()).hexdigest()[:16]
    if (key, client_id) in _RUNS:
        run = _RUNS[key, client_id]
        if run.public_x is None and site is not None:  # U may have arrived since
            run.public_x = run.runtime.public = site.public()
        return run
    from cosmos_pl.parsers import build_fit_parser

    parser = build_fit_parser()
    init = parser.instantiate(parser.parse_string(config_yaml))
    path = None if cache is None else cache / key / f"client_{client_id}.pt"
    part = None
    if path is not None and path.is_file():
        try:
            part = torch.load(path, map_location="cpu", weights_only=True)
        except Exception:  # a torn or foreign file: build the data again, and rewrite it
            part = None
    if part is None:
        from cosmos_pl.config import validate_config

        validate_config(init)
        part = site_part(init, client_id, site) if site is not None else partition_part(init, client_id)
    data = ClientData(**{f: part[f] for f in DATA_FIELDS}, class_counts=part["class_counts"].numpy())
    public_x = part.get("public_x") if site is None else site.public()
    runtime = ClientRuntime(init.seed, init.clients, init.transformations, init.trainer, public_x,
                          int(part["num_classes"]))
    run = NodeRun(key, init, client_id, data, public_x, int(part["num_clients"]), int(part["num_classes"]),
                  int(part["in_chans"]), tuple(int(v) for v in part["image_shape"]), runtime,
                  public_fingerprint(public_x) if site is None else site.fingerprint)
    if "initial_state" not in part:  # the round-0 model's weights, so that a joining node need not build it
        model = run.initial_model(client_id)
        part["initial_state"], part["parameters"] = model.state_dict(), count_parameters(personal_model(model))
        if path is not None:
            atomic_save(part, path)
    run.initial_state, run.parameters = part["initial_state"], int(part["parameters"])
    _RUNS.clear()  # one run at a time per process: free the previous run's data
    _RUNS[key, client_id] = run
    return run


def partition_part(init: Any, client_id: int) -> dict[str, Any]:
    """Client ``client_id``'s part of the federation the config builds (``partition-id`` mode), and U."""
    _, fed = init.data.build(init.seed)
    if not 0 <= client_id < fed.num_clients:
        raise ConfigError(f"node config partition-id={client_id!r}: give each node its own client, "
                          f"0..{fed.num_clients - 1} (flower-supernode --node-config 'partition-id=0')")
    mine = fed.clients[client_id]
    return {**{f: getattr(mine, f) for f in DATA_FIELDS}, "class_counts": torch.as_tensor(mine.class_counts),
            "public_x": fed.public_x, "num_clients": fed.num_clients, "num_classes": fed.num_classes,
            "in_chans": fed.in_chans, "image_shape": list(fed.image_shape)}


def site_part(init: Any, client_id: int, site: Site) -> dict[str, Any]:
    """The site's own data for the run (``data`` mode), its labels mapped to the run's classes."""
    from cosmos_pl.data import load_site
    from cosmos_pl.errors import DataError

    n = int(init.data.num_clients)
    if not 0 <= client_id < n:
        raise ConfigError(f"node config partition-id={client_id!r}: give each node its own client, 0..{n - 1} "
                          "(flower-supernode --node-config 'partition-id=0 data=...')")
    try:
        mine = load_site(site.folder, list(site.classes), site.public_shape[1:], init.data.validation_fraction,
                         init.seed, client_id)
    except (DataError, FileNotFoundError, OSError) as err:
        raise SiteDataError(client_id, " ".join(str(err).split())) from None
    return {**{f: getattr(mine, f) for f in DATA_FIELDS}, "class_counts": torch.as_tensor(mine.class_counts),
            "num_clients": n, "num_classes": len(site.classes), "in_chans": int(site.public_shape[1]),
            "image_shape": [int(v) for v in site.public_shape[2:]]}


def clear_runs() -> None:
    """Forget the runs kept in this process (as a new message's process starts with none)."""
    _RUNS.clear()

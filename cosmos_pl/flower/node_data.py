"""A node's run: the settings, its own client's data (never the other clients'), U, and the node's data cache.

The server's ``query.hello`` carries the run's resolved config; the node builds the same federation as the server
(same settings and seed) and keeps only its own client's part (``partition-id`` mode), or reads its site's own folder
(``data`` mode, U as the server sent it). It keeps them in ``state-dir/data/<key>/client_<id>.pt``, so the later
messages of the run (each one a new ClientApp process in Flower) load them instead of rebuilding the federation.

The key is a hash of what the data are built from: the config text in ``partition-id`` mode; in ``data`` mode also
the class list and U's shape the server sent and the contents of the site's folder (:func:`folder_digest`), so a
site whose files changed, or a server with another class list, gets a fresh build, never another run's cache.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import torch

from cosmos_pl.data import ClientData
from cosmos_pl.errors import ConfigError
from cosmos_pl.federated.initial_models import client_backbone, initial_model
from cosmos_pl.files import atomic_save, atomic_write_text
from cosmos_pl.flower.wire import HEX
from cosmos_pl.models import count_parameters
from cosmos_pl.models.personal import personal_model
from cosmos_pl.objectives.runtime import ClientRuntime
from cosmos_pl.uploads import public_fingerprint

__all__ = ["DATA_FIELDS", "NodeRun", "Site", "SiteDataError", "checked_hex", "clear_runs", "data_key", "folder_digest",
           "load_run", "partition_part", "site_part"]

_RUNS: dict[tuple[str, int], "NodeRun"] = {}  # per process, by (data key, client): one run at a time
#: A file changed this recently (ns) may change again within the file system's timestamp granularity, keeping its
#: size and mtime: its digest is not kept in the index, so it is read again next time (git's "racy" entries).
_RACY_NS = 2_000_000_000


def checked_hex(name: str, value: Any) -> str:
    """``value``, a string the server sent that becomes part of a path on this node (the run token, U's
    fingerprint), if it is lowercase hex of 1 to 64 digits (:data:`cosmos_pl.flower.wire.HEX`): no ``/``, ``..`` or
    anything else a path could be steered with.

    Raises:
        ValueError: any other value (a join refusal in a hello, the client's failure in a later message).
    """
    if not isinstance(value, str) or not HEX.fullmatch(value):
        raise ValueError(f"the server sent {name}={value!r}: not a hex string of at most 64 digits; refusing "
                         "it (it would become part of a path on this node)")
    return value


@dataclass
class NodeRun:
    """What a node holds for the run: the settings, its own client's data (never the other clients'), U and the
    client runtime.

    Attributes:
        config_hash: the data key (:func:`data_key`): its cache folder's name.
        init: the run's parsed settings.
        data: the client's own data (training, test and validation splits).
        public: U, uint8 ``[n, C, H, W]``.
        num_clients, num_classes, in_chans, image_shape: the federation's N, M, C and (H, W).
        runtime: the settings every client step reads, and the tasks it builds (the same as in-process).
        fingerprint: U's fingerprint.
        initial_state: the client's round-0 model weights, kept in the disk cache beside its data.
    """

    config_hash: str
    init: Any
    client_id: int
    data: ClientData
    public: Optional[torch.Tensor]
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

    def __post_init__(self) -> None:
        checked_hex("public_fingerprint", self.fingerprint)  # U's file name on this node

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


def folder_digest(folder: str | Path, index_path: Optional[Path] = None) -> str:
    r"""SHA-256 (hex) of a folder's contents: over every regular file under it (symbolic links followed, as the data
    are read), sorted by its path relative to ``folder`` (``/``-separated), the line ``"<relative path>\0<SHA-256
    of the file's bytes>\n"``. Equal digests, equal files.

    With ``index_path`` (a JSON file ``{absolute path: [size, mtime_ns, sha256]}``) a file whose size and mtime are
    those indexed is not read again: Flower starts a process per message, and a site's folder may be large. The
    index is rewritten (atomically) when it changed; a file modified in the last 2 s is not indexed (its next change
    may keep its size and mtime), and a missing or unreadable index is rebuilt.

    Raises:
        OSError: a file or folder under ``folder`` cannot be read.
    """
    root = Path(os.path.abspath(folder))
    index: dict[str, Any] = {}
    if index_path is not None and index_path.is_file():
        try:
            index = json.loads(index_path.read_text())
            index = index if isinstance(index, dict) else {}
        except (OSError, ValueError):  # torn or foreign: rebuilt below
            index = {}
    files: list[tuple[str, Path]] = []
    seen_dirs: set[tuple[int, int]] = set()

    def fail(err: OSError) -> None:
        raise err

    for where, dirs, names in os.walk(root, onerror=fail, followlinks=True):
        st = os.stat(where)
        if (st.st_dev, st.st_ino) in seen_dirs:  # a link back to a folder already walked
            dirs[:] = []
            continue
        seen_dirs.add((st.st_dev, st.st_ino))
        dirs.sort()
        for name in names:
            path = Path(where) / name
            if path.is_file():
                files.append((path.relative_to(root).as_posix(), path))
    files.sort()
    now = time.time_ns()
    mine: dict[str, list[Any]] = {}
    h = hashlib.sha256()
    for rel, path in files:
        st = path.stat()
        known = index.get(str(path))
        if (isinstance(known, list) and len(known) == 3 and known[:2] == [st.st_size, st.st_mtime_ns]
                and isinstance(known[2], str)):
            digest = known[2]
        else:
            file_hash = hashlib.sha256()
            with open(path, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    file_hash.update(block)
            digest = file_hash.hexdigest()
        if now - st.st_mtime_ns >= _RACY_NS:
            mine[str(path)] = [st.st_size, st.st_mtime_ns, digest]
        h.update(f"{rel}\0{digest}\n".encode())
    if index_path is not None:
        prefix = str(root) + os.sep
        updated = {k: v for k, v in index.items() if not k.startswith(prefix)}  # other folders' entries stay
        updated.update(mine)
        if updated != index:
            atomic_write_text(index_path, json.dumps(updated, sort_keys=True) + "\n")
    return h.hexdigest()


def data_key(config_yaml: str, site: Optional[Site] = None, cache: Optional[Path] = None) -> str:
    """The key of a client's data (16 hex digits): SHA-256 of the config text; for a site, of the config text, the
    class list and U's shape the server sent, and the folder's :func:`folder_digest` (its index kept in
    ``cache/file_digests.json``).

    Raises:
        OSError: a file of the site's folder cannot be read.
    """
    if site is None:
        return hashlib.sha256(config_yaml.encode()).hexdigest()[:16]  # partition-id mode: the config says it all
    contents = folder_digest(site.folder, None if cache is None else cache / "file_digests.json")
    text = json.dumps([config_yaml, list(site.classes), [int(v) for v in site.public_shape], contents])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def load_run(config_yaml: str, client_id: int, cache: Optional[Path] = None, site: Optional[Site] = None) -> NodeRun:
    """Parse the run's resolved config and get client ``client_id``'s data and U: from the node's disk cache
    (``cache/<data key>/client_<id>.pt``, :func:`data_key`, written atomically by the first message of the run),
    else from the site's own folder (``site``: its data; U as the server sent it), or by building the federation as
    the server does (same settings and seed) and keeping this client's part. Flower starts a process per message,
    so only the first message pays for loading the data. Kept per process too (one run at a time).

    Raises:
        ConfigError / DataError / FileNotFoundError: the config is invalid here or the data cannot be loaded.
        ConfigError: ``client_id`` is not a client of the federation (0..N-1).
        SiteDataError: the site's data cannot be used (naming the file or class), or a file of its folder cannot
            be read.
    """
    try:
        key = data_key(config_yaml, site, cache)
    except OSError as err:  # the folder is there (the hello checked it), a file in it is not readable
        raise SiteDataError(client_id, f"node config data={site.folder!r}: cannot read "
                                       f"{err.filename or 'a file under it'} ({err.strerror or err}): make every "
                                       "file of the site's folder readable by this node's user") from None
    if (key, client_id) in _RUNS:
        run = _RUNS[key, client_id]
        if run.public is None and site is not None:  # U may have arrived since
            run.public = run.runtime.public = site.public()
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
    public = part.get("public_x") if site is None else site.public()
    from cosmos_pl.config import run_precision

    note = run_precision(init)  # this node's GPUs: bf16-mixed, or trainer.precision_fallback where they lack bf16
    if note:
        print(note, file=sys.stderr, flush=True)
    runtime = ClientRuntime(init.seed, init.clients, init.transformations, init.trainer, public,
                          int(part["num_classes"]))
    run = NodeRun(key, init, client_id, data, public, int(part["num_clients"]), int(part["num_classes"]),
                  int(part["in_chans"]), tuple(int(v) for v in part["image_shape"]), runtime,
                  public_fingerprint(public) if site is None else site.fingerprint)
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
            "public_x": fed.public, "num_clients": fed.num_clients, "num_classes": fed.num_classes,
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

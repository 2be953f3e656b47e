"""A node's state: its directories and identity, the working and committed model of its client, its node config.

The client's model lives in the node's state (``context.state``) while a round runs; at the end of each round it is
committed: kept in the node state and written atomically to the node's disk (``state-dir/<run token>/client_<id>.pt``),
so a node that is killed and restarted continues from its last committed round of the same run; the server draws a
new run token for every run, so a new run starts afresh.

The server's strings that become parts of paths on the node (the run token, U's fingerprint) are checked to be short
lowercase hex first (:func:`checked_hex`): a server cannot make a node write or read outside its state dir.
"""

from __future__ import annotations

import difflib
import hashlib
import os
import secrets
from pathlib import Path
from typing import Any, Optional

import torch
from flwr.app import ConfigRecord, Context

from cosmos_pl.errors import ConfigError
from cosmos_pl.execution.devices import available_cpus
from cosmos_pl.files import atomic_save
from cosmos_pl.flower import wire
from cosmos_pl.flower.node_data import NodeRun, Site, checked_hex, load_run
from cosmos_pl.training.client import Client

__all__ = ["COMMITTED", "DEFAULT_STATE_DIR", "META", "NODE_CONFIG_KEYS", "NotSetUp", "SITE_KEYS", "WORKING",
           "check_node_config", "check_site_folder", "checked_hex", "commit", "current_client", "data_cache",
           "identity", "keep_working", "meta_record", "model_digest", "node_site", "state_dir", "state_file",
           "threads"]

DEFAULT_STATE_DIR = Path.home() / ".cache" / "cosmos-pl" / "flower"
# the node config keys a node reads (flower-supernode --node-config); Flower's simulation engine also sets
# num-partitions on every virtual node, which the node accepts and does not read
NODE_CONFIG_KEYS = ("partition-id", "data", "state-dir", "threads")
_FLOWER_NODE_KEYS = ("num-partitions",)
#: The node state's records: the run's settings and rounds, the model of the round in progress, the committed model.
META, WORKING, COMMITTED = "cosmos.meta", "cosmos.working", "cosmos.committed"


def model_digest(state: dict[str, torch.Tensor]) -> str:
    """The first 16 hex digits of SHA-256 over a state dict's names, shapes and bytes: equal digests, equal models."""
    h = hashlib.sha256()
    for k in sorted(state):
        t = state[k].detach().cpu().contiguous()
        h.update(f"{k}|{tuple(t.shape)}|{t.dtype}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()[:16]


def state_dir(context: Context) -> Path:
    where = (context.node_config.get("state-dir") or context.run_config.get("node-state-dir")
             or os.environ.get("COSMOS_PL_NODE_STATE_DIR") or DEFAULT_STATE_DIR)
    return Path(str(where)).expanduser()


def state_file(context: Context, run_token: str, client_id: int) -> Path:
    """Where client ``client_id``'s committed model of the run ``run_token`` is kept.

    Raises:
        ValueError: ``run_token`` is not hex (:func:`checked_hex`).
    """
    return state_dir(context) / checked_hex("run_token", run_token) / f"client_{int(client_id)}.pt"


def identity(context: Context) -> str:
    """This node's identity: a random token kept in ``state-dir/node-identity`` (made once; the same after a
    restart from the same disk). The server lets a client id be held only by the identity that first held it."""
    path = state_dir(context) / "node-identity"
    if not path.is_file():
        from cosmos_pl.files import atomic_write_text

        atomic_write_text(path, secrets.token_hex(16) + "\n")
    return path.read_text().strip()


def data_cache(context: Context) -> Path:
    """Where the node keeps its client's data and U per run config (:func:`load_run`)."""
    return state_dir(context) / "data"


class NotSetUp(RuntimeError):
    """A message reached a node that has had no ``query.hello`` since it started: a restarted node that came back
    under its old node id (under SuperNode authentication the id follows the node's key). The server reads it as a
    node that left: it greets the node again at the start of the next round."""


def meta_record(context: Context) -> ConfigRecord:
    if META not in context.state:
        raise NotSetUp("this node has not been set up for the run (no query.hello received since it started); "
                       "the server sends query.hello to every new node at the start of each round")
    return context.state[META]


def threads(context: Context, run: NodeRun) -> int:
    given = context.node_config.get("threads") or run.init.executor.threads_per_worker
    return int(given) if given else available_cpus()


def current_client(context: Context, rnd: int) -> tuple[NodeRun, Client]:
    """The run and the client with its current model for round ``rnd``: the working model of this round, or the
    committed one when this round has not touched it yet (a new round, or a node restarted mid-round)."""
    meta = meta_record(context)
    cid = int(meta["client_id"])
    run = load_run(str(meta["config_yaml"]), cid, data_cache(context), node_site(context))
    if run.public is None:
        raise RuntimeError(f"this node has not received U (fingerprint {meta['public_fingerprint']}) yet: the server "
                           "sends it after the node's hello")
    torch.set_num_threads(threads(context, run))
    model = run.initial_model(cid)
    source = WORKING if int(meta["working_round"]) == rnd else COMMITTED
    model.load_state_dict(wire.record_to_tensors(context.state[source]))
    return run, Client(cid, run.backbone(cid), model, run.data)


def keep_working(context: Context, rnd: int, model: torch.nn.Module) -> None:
    context.state[WORKING] = wire.tensors_to_record(model.state_dict())
    meta_record(context)["working_round"] = rnd


def commit(context: Context, rnd: int, model: torch.nn.Module) -> str:
    """Make ``model`` the client's committed model after round ``rnd``: node state and an atomic file on disk."""
    meta = meta_record(context)
    state = model.state_dict()
    digest = model_digest(state)
    atomic_save({"round": rnd, "digest": digest, "model": state},
                state_file(context, str(meta["run_token"]), int(meta["client_id"])))
    context.state[COMMITTED] = wire.tensors_to_record(state)
    context.state[WORKING] = context.state[COMMITTED]
    meta["committed_round"], meta["working_round"], meta["digest"] = rnd, rnd, digest
    return digest


def check_node_config(node_config: Any) -> None:
    """Refuse node config keys the node does not read (a misspelt key would otherwise be ignored silently).

    Raises:
        ConfigError: one line naming each unknown key with its close match (``difflib``), and the keys a node
            reads (:data:`NODE_CONFIG_KEYS`).
    """
    known = NODE_CONFIG_KEYS + _FLOWER_NODE_KEYS
    unknown = sorted(str(k) for k in node_config if k not in known)
    if unknown:
        named = []
        for key in unknown:
            close = difflib.get_close_matches(key, known, n=1)
            named.append(f"'{key}'" + (f" (did you mean '{close[0]}'?)" if close else ""))
        raise ConfigError(f"unknown node config key{'s' if len(unknown) > 1 else ''} {', '.join(named)}: a node "
                          f"reads {', '.join(NODE_CONFIG_KEYS)} (flower-supernode --node-config "
                          f"\"partition-id=0 data='/srv/site_0' state-dir='/var/lib/cosmos-pl' threads=4\")")


SITE_KEYS = ("classes", "public_shape", "public_fingerprint")  # what the server says of the run to a site


def node_site(context: Context, cfg: Any = None) -> Optional[Site]:
    """The node's site (node config ``data``), from the hello's config or the node state (the server's
    ``classes``, ``public_shape`` and ``public_fingerprint``); None in partition-id mode.

    Raises:
        ConfigError: the server sent no class list.
        ValueError: U's fingerprint is not hex (:class:`~cosmos_pl.flower.node_data.Site` checks it: it names U's
            file on this node).
    """
    folder = context.node_config.get("data")
    if not folder:
        return None
    source = cfg if cfg is not None else meta_record(context)
    if "classes" not in source:
        raise ConfigError("node config data=...: the server sent no class list (a server of another cosmos-pl "
                          "version, or one that builds the clients' data itself); run the same version on both")
    return Site(str(folder), tuple(str(c) for c in source["classes"]), tuple(int(v) for v in source["public_shape"]),
                source["public_fingerprint"], state_dir(context) / "public")  # Site refuses a non-hex one


def _user() -> str:
    try:
        import pwd

        return pwd.getpwuid(os.geteuid()).pw_name
    except (ImportError, KeyError, AttributeError):
        return f"uid {os.geteuid()}" if hasattr(os, "geteuid") else "this user"


def check_site_folder(folder: str) -> None:
    """Refuse a node config ``data`` folder that is not there or that this node's user cannot list and read: the
    node does not join (the server records its refusal), rather than holding a client that fails every round. A
    folder that is there but whose contents cannot be used (an unknown class, another image size) is the client's
    :class:`~cosmos_pl.flower.node_data.SiteDataError` instead.

    Raises:
        ConfigError: one line naming the folder and the fix.
    """
    path = Path(folder)  # as the site's data is read (a node config value is not expanded by a shell)
    if not path.exists():
        raise ConfigError(f"node config data={folder!r}: no such folder (give the folder cosmos-pl export-partition "
                          "wrote for this site)")
    if not path.is_dir():
        raise ConfigError(f"node config data={folder!r}: is not a folder (give the folder cosmos-pl "
                          "export-partition wrote for this site, or an ImageFolder tree with train/ and test/)")
    unreadable = (f"node config data={folder!r}: is not readable by this node's user ({_user()}: give it read and "
                  "list permission on the folder, e.g. chmod -R u+rX or chgrp, or run the SuperNode as its owner)")
    if not os.access(path, os.R_OK | os.X_OK):
        raise ConfigError(unreadable)
    try:
        with os.scandir(path) as entries:
            next(entries, None)
    except OSError:
        raise ConfigError(unreadable) from None

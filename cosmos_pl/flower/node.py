"""One client on a Flower node: its data and model built from the run's config, the client steps, its model kept.

The server's ``query.hello`` carries the run's resolved config; the node builds the same federation as the
server (same settings and seed) and keeps only its own client's data and U: client ``partition-id`` (Flower's node
config). It keeps them in ``state-dir/data/<config hash>/client_<id>.pt``, so the later messages of the run (each
one a new ClientApp process in Flower) load them instead of rebuilding the federation.
The client's model lives in the node's state (``context.state``) while a round runs; at the end of each round
(``evaluate.scores``) it is committed: kept in the node state and written atomically to the node's disk
(``state-dir/<run token>/client_<id>.pt``), so a node that is killed and restarted continues from its last
committed round of the same run; the server draws a new run token for every run, so a new run starts afresh. A
client that failed a round (the server says so) rolls back to its committed model, as in-process. At the end of an
evaluated round the node scores its model, and the models the server sent for the purpose (its cluster teacher),
on its own test and validation splits: the server never sees them.
"""

from __future__ import annotations

import difflib
import hashlib
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import torch
from flwr.app import ConfigRecord, Context, MetricRecord, RecordDict

from cosmos_pl.communication import CommunicationConfig
from cosmos_pl.data import ClientData
from cosmos_pl.errors import ConfigError
from cosmos_pl.federated.executor import available_cpus
from cosmos_pl.files import atomic_save
from cosmos_pl.federated.initial_models import client_backbone, initial_model
from cosmos_pl.flower import wire
from cosmos_pl.models import count_parameters, create_backbone
from cosmos_pl.models.personal import load_shared_weights, personal_model, shared_weights
from cosmos_pl.objectives.runtime import ClientRuntime, encode_upload
from cosmos_pl.objectives.step import steps_from_wire
from cosmos_pl.training.client import Client
from cosmos_pl.uploads import public_fingerprint

__all__ = ["NodeRun", "Site", "SiteDataError", "StepFailed", "load_run", "model_digest", "check_node_config", "hello",
           "public", "pseudo_labels",
           "weights", "load_weights", "scores", "unpack_scores", "DEFAULT_STATE_DIR", "NODE_CONFIG_KEYS"]

DEFAULT_STATE_DIR = Path.home() / ".cache" / "cosmos-pl" / "flower"
# the node config keys a node reads (flower-supernode --node-config); Flower's simulation engine also sets
# num-partitions on every virtual node, which the node accepts and does not read
NODE_CONFIG_KEYS = ("partition-id", "data", "state-dir", "threads")
_FLOWER_NODE_KEYS = ("num-partitions",)
_META, _WORKING, _COMMITTED = "cosmos.meta", "cosmos.working", "cosmos.committed"
_RUNS: dict[tuple[str, int], "NodeRun"] = {}  # per process, by (config hash, client): one run at a time


@dataclass
class NodeRun:
    """What a node holds for the run: the settings, its own client's data (never the other clients'), U and the
    client steps.

    Attributes:
        data: the client's own data (training, test and validation splits).
        public_x: U, uint8 ``[n, C, H, W]``.
        num_clients, num_classes, in_chans, image_shape: the federation's N, M, C and (H, W).
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
    steps: ClientRuntime
    fingerprint: str
    shared_init: bool
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


_DATA_FIELDS = ("x", "y", "x_test", "y_test", "x_val", "y_val")


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
            run.public_x = run.steps.public = site.public()
        return run
    from cosmos_pl.cli import build_fit_parser

    parser = build_fit_parser()
    init = parser.instantiate(parser.parse_string(config_yaml))
    path = None if cache is None else cache / key / f"client_{client_id}.pt"
    blob = None
    if path is not None and path.is_file():
        try:
            blob = torch.load(path, map_location="cpu", weights_only=True)
        except Exception:  # a torn or foreign file: build the data again, and rewrite it
            blob = None
    if blob is None:
        from cosmos_pl.config import validate_config

        validate_config(init)
        blob = _site_blob(init, client_id, site) if site is not None else _partition_blob(init, client_id)
    data = ClientData(**{f: blob[f] for f in _DATA_FIELDS}, class_counts=blob["class_counts"].numpy())
    public_x = blob.get("public_x") if site is None else site.public()
    steps = ClientRuntime(init.seed, init.clients, init.transformations, init.trainer, public_x,
                          int(blob["num_classes"]))
    run = NodeRun(key, init, client_id, data, public_x, int(blob["num_clients"]), int(blob["num_classes"]),
                  int(blob["in_chans"]), tuple(int(v) for v in blob["image_shape"]), steps,
                  public_fingerprint(public_x) if site is None else site.fingerprint, bool(init.algorithm.shared_init))
    if "initial_state" not in blob:  # the round-0 model's weights, so that a joining node need not build it
        model = run.initial_model(client_id)
        blob["initial_state"], blob["parameters"] = model.state_dict(), count_parameters(personal_model(model))
        if path is not None:
            atomic_save(blob, path)
    run.initial_state, run.parameters = blob["initial_state"], int(blob["parameters"])
    _RUNS.clear()  # one run at a time per process: free the previous run's data
    _RUNS[key, client_id] = run
    return run


def _partition_blob(init: Any, client_id: int) -> dict[str, Any]:
    """Client ``client_id``'s part of the federation the config builds (``partition-id`` mode), and U."""
    _, fed = init.data.build(init.seed)
    if not 0 <= client_id < fed.num_clients:
        raise ConfigError(f"node config partition-id={client_id!r}: give each node its own client, "
                          f"0..{fed.num_clients - 1} (flower-supernode --node-config 'partition-id=0')")
    mine = fed.clients[client_id]
    return {**{f: getattr(mine, f) for f in _DATA_FIELDS}, "class_counts": torch.as_tensor(mine.class_counts),
            "public_x": fed.public_x, "num_clients": fed.num_clients, "num_classes": fed.num_classes,
            "in_chans": fed.in_chans, "image_shape": list(fed.image_shape)}


def _site_blob(init: Any, client_id: int, site: Site) -> dict[str, Any]:
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
    return {**{f: getattr(mine, f) for f in _DATA_FIELDS}, "class_counts": torch.as_tensor(mine.class_counts),
            "num_clients": n, "num_classes": len(site.classes), "in_chans": int(site.public_shape[1]),
            "image_shape": [int(v) for v in site.public_shape[2:]]}


def model_digest(state: dict[str, torch.Tensor]) -> str:
    """The first 16 hex digits of SHA-256 over a state dict's names, shapes and bytes: equal digests, equal models."""
    h = hashlib.sha256()
    for k in sorted(state):
        t = state[k].detach().cpu().contiguous()
        h.update(f"{k}|{tuple(t.shape)}|{t.dtype}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()[:16]


# --------------------------------------------------------------------------- node state
def _state_dir(context: Context) -> Path:
    where = (context.node_config.get("state-dir") or context.run_config.get("node-state-dir")
             or os.environ.get("COSMOS_PL_NODE_STATE_DIR") or DEFAULT_STATE_DIR)
    return Path(str(where)).expanduser()


def _state_file(context: Context, run_token: str, client_id: int) -> Path:
    return _state_dir(context) / run_token / f"client_{client_id}.pt"


def _identity(context: Context) -> str:
    """This node's identity: a random token kept in ``state-dir/node-identity`` (made once; the same after a
    restart from the same disk). The server lets a client id be held only by the identity that first held it."""
    path = _state_dir(context) / "node-identity"
    if not path.is_file():
        from cosmos_pl.files import atomic_write_text

        atomic_write_text(path, secrets.token_hex(16) + "\n")
    return path.read_text().strip()


def _data_cache(context: Context) -> Path:
    """Where the node keeps its client's data and U per run config (:func:`load_run`)."""
    return _state_dir(context) / "data"


class NotSetUp(RuntimeError):
    """A message reached a node that has had no ``query.hello`` since it started: a restarted node that came back
    under its old node id (under SuperNode authentication the id follows the node's key). The server reads it as a
    node that left: it greets the node again at the start of the next round."""


def _meta(context: Context) -> ConfigRecord:
    if _META not in context.state:
        raise NotSetUp("this node has not been set up for the run (no query.hello received since it started); "
                       "the server sends query.hello to every new node at the start of each round")
    return context.state[_META]


def _threads(context: Context, run: NodeRun) -> int:
    given = context.node_config.get("threads") or run.init.executor.threads_per_worker
    return int(given) if given else available_cpus()


def _client(context: Context, rnd: int) -> tuple[NodeRun, Client]:
    """The run and the client with its current model for round ``rnd``: the working model of this round, or the
    committed one when this round has not touched it yet (a new round, or a node restarted mid-round)."""
    meta = _meta(context)
    cid = int(meta["client_id"])
    run = load_run(str(meta["config_yaml"]), cid, _data_cache(context), _site(context))
    if run.public_x is None:
        raise RuntimeError(f"this node has not received U (fingerprint {meta['public_fingerprint']}) yet: the server "
                           "sends it after the node's hello")
    torch.set_num_threads(_threads(context, run))
    model = run.initial_model(cid)
    source = _WORKING if int(meta["working_round"]) == rnd else _COMMITTED
    model.load_state_dict(wire.record_to_tensors(context.state[source]))
    return run, Client(cid, run.backbone(cid), model, run.data)


def _keep_working(context: Context, rnd: int, model: torch.nn.Module) -> None:
    context.state[_WORKING] = wire.tensors_to_record(model.state_dict())
    _meta(context)["working_round"] = rnd


def _commit(context: Context, rnd: int, model: torch.nn.Module) -> str:
    """Make ``model`` the client's committed model after round ``rnd``: node state and an atomic file on disk."""
    meta = _meta(context)
    state = model.state_dict()
    digest = model_digest(state)
    atomic_save({"round": rnd, "digest": digest, "model": state},
                _state_file(context, str(meta["run_token"]), int(meta["client_id"])))
    context.state[_COMMITTED] = wire.tensors_to_record(state)
    context.state[_WORKING] = context.state[_COMMITTED]
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


# --------------------------------------------------------------------------- handlers (content -> content)
def hello(content: RecordDict, context: Context) -> RecordDict:
    """Set the node up for the run: build its client (``partition-id``) and load its committed model from disk
    (a restarted node) or create the round-0 model. Replies the client id, the committed round and the digest.

    Raises:
        ConfigError: an unknown node config key (:func:`check_node_config`), no ``partition-id`` in the node
            config, or one out of range.
        ValueError: the server's public set U is not the one this node built.
    """
    check_node_config(context.node_config)  # before the run is built: a typo is refused in a moment
    cfg = content["config"]
    pid = context.node_config.get("partition-id")
    if pid is None:
        raise ConfigError("node config partition-id=None: give each node its own client, 0..N-1 "
                          "(flower-supernode --node-config 'partition-id=0')")
    site = _site(context, cfg)
    run = load_run(str(cfg["config_yaml"]), int(pid), _data_cache(context), site)  # refuses a pid outside 0..N-1
    if site is None and run.fingerprint != str(cfg["public_fingerprint"]):
        raise ValueError(f"public set U differs: this node built U with fingerprint {run.fingerprint}, the server "
                         f"{cfg['public_fingerprint']}; give the node the same data and cosmos-pl version")
    cid = int(pid)
    meta = context.state.get(_META)
    token = str(cfg["run_token"])
    if meta is None or str(meta["run_token"]) != token or int(meta["client_id"]) != cid:
        path = _state_file(context, token, cid)
        if path.is_file():  # a restarted node: continue from its last committed round
            saved = torch.load(path, weights_only=True)
            state, committed, digest = saved["model"], int(saved["round"]), str(saved["digest"])
        else:
            state = run.initial_state  # from the disk cache: a joining node does not build (or import) the model
            committed, digest = -1, model_digest(state)
        context.state[_COMMITTED] = wire.tensors_to_record(state)
        context.state[_WORKING] = context.state[_COMMITTED]
        context.state[_META] = ConfigRecord({"config_yaml": str(cfg["config_yaml"]), "run_token": token,
                                             "client_id": cid, "committed_round": committed,
                                             "working_round": committed, "digest": digest,
                                             **{k: cfg[k] for k in _SITE_KEYS if k in cfg}})
    meta = context.state[_META]
    d = run.data
    return RecordDict({"config": ConfigRecord({
        "client_id": cid, "committed_round": int(meta["committed_round"]), "digest": str(meta["digest"]),
        "public_fingerprint": run.fingerprint, "backbone": run.backbone(cid), "train_size": len(d.y),
        "test_size": len(d.y_test), "validation_size": 0 if d.y_val is None else len(d.y_val),
        "parameters": run.parameters, "has_public": run.public_x is not None, "identity": _identity(context)})})


_SITE_KEYS = ("classes", "public_shape", "public_fingerprint")  # what the server says of the run to a site


def _site(context: Context, cfg: Any = None) -> Optional[Site]:
    """The node's site (node config ``data``), from the hello's config or the node state; None in partition-id
    mode."""
    folder = context.node_config.get("data")
    if not folder:
        return None
    source = cfg if cfg is not None else _meta(context)
    if "classes" not in source:
        raise ConfigError("node config data=...: the server sent no class list (a server of another cosmos-pl "
                          "version, or one that builds the clients' data itself); run the same version on both")
    return Site(str(folder), tuple(str(c) for c in source["classes"]), tuple(int(v) for v in source["public_shape"]),
                str(source["public_fingerprint"]), _state_dir(context) / "public")


def public(content: RecordDict, context: Context) -> RecordDict:
    """A chunk of U from the server (a site that did not have it: ``query.public``): rows ``[start, start + k)`` of
    U ``[n, C, H, W]`` uint8. Kept on the node's disk; once the last has arrived, U is checked against its
    fingerprint and kept as ``state-dir/public/<fingerprint>.pt``, for every later run with the same U.

    Raises:
        ValueError: the chunks do not make U (another fingerprint, missing rows).
    """
    cfg = content["config"]
    fp, start, total = str(cfg["public_fingerprint"]), int(cfg["start"]), int(cfg["rows"])
    parts = _state_dir(context) / "public" / f"{fp}.parts"
    chunk = wire.record_to_tensors(content["arrays"])["x"]
    atomic_save(chunk, parts / f"{start:012d}.pt")
    stored = False
    if start + len(chunk) == total:  # the last chunk: U whole, or an error
        pieces = [torch.load(p, weights_only=True) for p in sorted(parts.glob("*.pt"))]
        x = torch.cat(pieces) if pieces else torch.zeros(0)
        if len(x) != total or public_fingerprint(x) != fp:
            raise ValueError(f"U arrived with {len(x)} of {total} rows and fingerprint {public_fingerprint(x)}, not "
                             f"{fp}: the server sends it again")
        atomic_save(x, _state_dir(context) / "public" / f"{fp}.pt")
        for p in parts.glob("*.pt"):
            p.unlink()
        parts.rmdir()
        stored = True
    return RecordDict({"config": ConfigRecord({"stored": stored})})


class StepFailed(Exception):
    """A training step carried by a message failed on the node; ``stage`` names it (``"client distillation"``)."""

    def __init__(self, stage: str, err: BaseException) -> None:
        super().__init__(" ".join(f"{type(err).__name__}: {err}".split())[:1000])
        self.stage = stage


def _run_steps(content: RecordDict, run: NodeRun, client: Client, rnd: int) -> dict[str, float]:
    """Run the training steps the message carries (:func:`cosmos_pl.objectives.step.steps_to_wire`), in order, on
    ``client.model``;
    returns their last-epoch losses as ``{"s<j>.<name>": value}``.

    Raises:
        StepFailed: a step raised (a non-finite loss, ...); the steps after it do not run.
    """
    cfg = dict(content["config"])
    arrays = wire.record_to_tensors(content["arrays"]) if "arrays" in content else {}
    out: dict[str, float] = {}
    for j, (step, target) in enumerate(steps_from_wire(cfg, arrays)):
        fn, kwargs = run.steps.train(client, rnd, step, target)
        try:
            losses = fn(**kwargs)
        except Exception as err:
            raise StepFailed(step.stage, err) from err
        out.update({f"s{j}.{k}": float(v) for k, v in (losses[-1] if losses else {}).items()})
    return out


def pseudo_labels(content: RecordDict, context: Context) -> RecordDict:
    """Run the carried training steps, then reply the client's pseudo-labels on U encoded per the round's options.

    Raises:
        ValueError: the server's U fingerprint differs from this node's (the client does not answer for another U).
        StepFailed: a carried training step failed.
    """
    cfg = content["config"]
    rnd = int(cfg["round"])
    run, client = _client(context, rnd)
    if str(cfg["public_fingerprint"]) != run.fingerprint:
        raise ValueError(f"round {rnd}: the server asks for pseudo-labels on U with fingerprint "
                         f"{cfg['public_fingerprint']}, this node holds {run.fingerprint}; not answering")
    losses = _run_steps(content, run, client, rnd)
    _keep_working(context, rnd, client.model)
    top_k = int(cfg["top_k"]) if int(cfg["top_k"]) > 0 else None
    fn, kwargs = run.steps.predict(client, rnd)
    payload = encode_upload(fn(**kwargs), str(cfg["kind"]), CommunicationConfig(str(cfg["dtype"]), top_k),
                            run.fingerprint)
    arrays, meta = wire.payload_to_record(payload)
    return RecordDict({"arrays": arrays, "config": ConfigRecord(meta), "losses": MetricRecord(losses)})


def weights(content: RecordDict, context: Context) -> RecordDict:
    """Run the carried training steps, then reply the float tensors the client shares for parameter averaging
    (FedAvg, Ditto, FedBABU: :func:`~cosmos_pl.models.personal.shared_weights`)."""
    rnd = int(content["config"]["round"])
    run, client = _client(context, rnd)
    losses = _run_steps(content, run, client, rnd)
    _keep_working(context, rnd, client.model)
    return RecordDict({"arrays": wire.tensors_to_record(shared_weights(client.model)),
        "losses": MetricRecord(losses)})


def load_weights(content: RecordDict, context: Context) -> RecordDict:
    """Run the carried training steps, then load the server's averaged weights (FedAvg; the array record
    ``weights``)."""
    rnd = int(content["config"]["round"])
    run, client = _client(context, rnd)
    losses = _run_steps(content, run, client, rnd)
    load_shared_weights(client.model, wire.record_to_tensors(content["weights"]))
    _keep_working(context, rnd, client.model)
    return RecordDict({"losses": MetricRecord(losses)})


def scores(content: RecordDict, context: Context) -> RecordDict:
    """End of round: run the carried training steps; roll back to the committed model if the server says the client
    failed the round or a step fails here; when the round is evaluated, score the model, and the models the server
    sent (its cluster teacher), on the client's own test (and validation) split; commit it. After the final round
    the models it was sent are kept beside its own (``state-dir/<run token>/teacher_model.pt``: the personalized
    model the client goes on with). Replies ``{split.model.metric: value}``, the steps' losses, the digest and any
    failure here."""
    cfg = content["config"]
    rnd = int(cfg["round"])
    meta = _meta(context)
    run, client = _client(context, rnd)
    failure: dict[str, str] = {}
    losses: dict[str, float] = {}
    if not bool(cfg["failed"]):
        try:
            losses = _run_steps(content, run, client, rnd)
        except StepFailed as err:
            failure = {"failed_step": err.stage, "failure": str(err)}
    if bool(cfg["failed"]) or failure:
        meta["working_round"] = int(meta["committed_round"])  # back to the model from the round's start
        run, client = _client(context, rnd)
    out: dict[str, Any] = {}
    if bool(cfg.get("evaluate", True)):
        sent = _sent_models(content, run)
        for split, (fn, kwargs) in run.steps.evaluate(client, rnd, {"client": client.model, **sent}):
            for name, metrics in fn(**kwargs).items():
                out.update({f"{split}.{name}.{k}": float(v) for k, v in metrics.items()})
        if bool(cfg.get("final", False)):  # the personalized model the client goes on with (COSMOS: its teacher)
            for name, model in sent.items():
                atomic_save({"backbone": str(cfg[f"eval.{name}.backbone"]), "model": model.state_dict()},
                            _state_file(context, str(meta["run_token"]), int(meta["client_id"])).with_name(
                                f"{name}_model.pt"))
    digest = _commit(context, rnd, client.model)
    return RecordDict({"metrics": MetricRecord(out), "losses": MetricRecord(losses),
                       "config": ConfigRecord({"digest": digest, **failure})})


def _sent_models(content: RecordDict, run: NodeRun) -> dict[str, torch.nn.Module]:
    """The models the server sent to be scored here (``eval.<name>``: the architecture's name and its float tensors,
    e.g. COSMOS's cluster teacher of this client), built for the run's images."""
    cfg = content["config"]
    out = {}
    for name in [n for n in str(cfg.get("eval", "")).split(",") if n]:
        model = create_backbone(str(cfg[f"eval.{name}.backbone"]), run.num_classes, run.in_chans,
                                max(run.image_shape))
        model.load_state_dict(wire.record_to_tensors(content[f"eval.{name}"]), strict=False)
        out[name] = model
    return out


def unpack_scores(metrics: MetricRecord) -> dict[str, dict[str, dict[str, float]]]:
    """``{split: {model: {metric: value}}}`` from :func:`scores`' reply (NaN stays NaN: an empty split)."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for key, value in metrics.items():
        split, name, metric = key.split(".")
        out.setdefault(split, {}).setdefault(name, {})[metric] = float(value)
    return out

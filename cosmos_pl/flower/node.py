"""One client on a Flower node: its data and model built from the run's config, the client steps, its model kept.

The server's ``query.hello`` carries the run's resolved config; the node builds the same federation as the
server (same settings and seed) and keeps its own partition: client ``partition-id`` (Flower's node config).
The client's model lives in the node's state (``context.state``) while a round runs; at the end of each round
(``evaluate.scores``) it is committed: kept in the node state and written atomically to the node's disk
(``state-dir/<run token>/client_<id>.pt``), so a node that is killed and restarted continues from its last
committed round of the same run; the server draws a new run token for every run, so a new run starts afresh. A client that
failed a round (the server says so) rolls back to its committed model, as in-process.
"""

from __future__ import annotations

import difflib
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from flwr.app import ConfigRecord, Context, MetricRecord, RecordDict

from cosmos_pl.communication import CommunicationConfig
from cosmos_pl.errors import ConfigError
from cosmos_pl.federated.client import Client
from cosmos_pl.federated.client_steps import ClientSteps, encode_upload, stage_of
from cosmos_pl.federated.executor import available_cpus
from cosmos_pl.federated.run_directory import atomic_save
from cosmos_pl.federated.stages import stage_seed
from cosmos_pl.flower import wire
from cosmos_pl.models import create_backbone
from cosmos_pl.uploads import public_fingerprint

__all__ = ["NodeRun", "StepFailed", "load_run", "model_digest", "check_node_config", "hello", "pseudo_labels",
           "weights", "load_weights", "scores", "unpack_scores", "DEFAULT_STATE_DIR", "NODE_CONFIG_KEYS"]

DEFAULT_STATE_DIR = Path.home() / ".cache" / "cosmos-pl" / "flower"
# the node config keys a node reads (flower-supernode --node-config); Flower's simulation engine also sets
# num-partitions on every virtual node, which the node accepts and does not read
NODE_CONFIG_KEYS = ("partition-id", "state-dir", "threads")
_FLOWER_NODE_KEYS = ("num-partitions",)
_META, _WORKING, _COMMITTED = "cosmos.meta", "cosmos.working", "cosmos.committed"
_RUNS: dict[str, "NodeRun"] = {}  # per process, by config hash: a cache (a node rebuilds it from its state)


@dataclass
class NodeRun:
    """What a node builds from the run's config: the settings, the federation (the node reads only its own
    client's partition and U) and the client steps."""

    config_hash: str
    init: Any
    federation: Any
    steps: ClientSteps
    fingerprint: str
    shared_init: bool

    def backbone(self, client_id: int) -> str:
        names = self.init.clients.backbones
        return names[client_id % len(names)]

    def initial_model(self, client_id: int) -> torch.nn.Module:
        """The client's round-0 model, the same as the in-process runner's (``Runner.make_backbone``)."""
        fed = self.federation
        torch.manual_seed(stage_seed(self.init.seed, 0, "init", 0 if self.shared_init else client_id))
        return create_backbone(self.backbone(client_id), fed.num_classes, fed.in_chans, max(fed.image_shape))


def load_run(config_yaml: str) -> NodeRun:
    """Parse the run's resolved config and build its federation (cached per process by the config's hash).

    Raises:
        ConfigError / DataError / FileNotFoundError: the config is invalid here or the data cannot be loaded.
    """
    key = hashlib.sha256(config_yaml.encode()).hexdigest()[:16]
    if key not in _RUNS:
        from cosmos_pl.cli import build_fit_parser
        from cosmos_pl.config import validate_config

        parser = build_fit_parser()
        init = parser.instantiate(parser.parse_string(config_yaml))
        validate_config(init)
        _, federation = init.data.build(init.seed)
        steps = ClientSteps(init.seed, init.clients, init.transformations, init.trainer, federation.public_x,
                            federation.num_classes)
        _RUNS.clear()  # one run at a time per process: free the previous run's data
        _RUNS[key] = NodeRun(key, init, federation, steps, public_fingerprint(federation.public_x),
                             bool(init.algorithm.shared_init))
    return _RUNS[key]


def model_digest(state: dict[str, torch.Tensor]) -> str:
    """The first 16 hex digits of SHA-256 over a state dict's names, shapes and bytes: equal digests, equal models."""
    h = hashlib.sha256()
    for k in sorted(state):
        t = state[k].detach().cpu().contiguous()
        h.update(f"{k}|{tuple(t.shape)}|{t.dtype}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()[:16]


# --------------------------------------------------------------------------- node state
def _state_file(context: Context, run_token: str, client_id: int) -> Path:
    where = (context.node_config.get("state-dir") or context.run_config.get("node-state-dir")
             or os.environ.get("COSMOS_PL_NODE_STATE_DIR") or DEFAULT_STATE_DIR)
    return Path(str(where)).expanduser() / run_token / f"client_{client_id}.pt"


def _meta(context: Context) -> ConfigRecord:
    if _META not in context.state:
        raise RuntimeError("this node has not been set up for the run (no query.hello received since it started); "
                           "the server sends query.hello to every new node at the start of each round")
    return context.state[_META]


def _threads(context: Context, run: NodeRun) -> int:
    given = context.node_config.get("threads") or run.init.executor.threads_per_worker
    return int(given) if given else available_cpus()


def _client(context: Context, rnd: int) -> tuple[NodeRun, Client]:
    """The run and the client with its current model for round ``rnd``: the working model of this round, or the
    committed one when this round has not touched it yet (a new round, or a node restarted mid-round)."""
    meta = _meta(context)
    run = load_run(str(meta["config_yaml"]))
    torch.set_num_threads(_threads(context, run))
    cid = int(meta["client_id"])
    model = run.initial_model(cid)
    source = _WORKING if int(meta["working_round"]) == rnd else _COMMITTED
    model.load_state_dict(wire.record_to_tensors(context.state[source]))
    return run, Client(cid, run.backbone(cid), model, run.federation.clients[cid])


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
                          f"\"partition-id=0 state-dir='/var/lib/cosmos-pl' threads=4\")")


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
    run = load_run(str(cfg["config_yaml"]))
    n = run.federation.num_clients
    pid = context.node_config.get("partition-id")
    if pid is None or not 0 <= int(pid) < n:
        raise ConfigError(f"node config partition-id={pid!r}: give each node its own client, 0..{n - 1} "
                          f"(flower-supernode --node-config 'partition-id=0')")
    if run.fingerprint != str(cfg["public_fingerprint"]):
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
            state = run.initial_model(cid).state_dict()
            committed, digest = -1, model_digest(state)
        context.state[_COMMITTED] = wire.tensors_to_record(state)
        context.state[_WORKING] = context.state[_COMMITTED]
        context.state[_META] = ConfigRecord({"config_yaml": str(cfg["config_yaml"]), "run_token": token,
                                             "client_id": cid, "committed_round": committed,
                                             "working_round": committed, "digest": digest})
    meta = context.state[_META]
    return RecordDict({"config": ConfigRecord({
        "client_id": cid, "committed_round": int(meta["committed_round"]), "digest": str(meta["digest"]),
        "public_fingerprint": run.fingerprint, "backbone": run.backbone(cid)})})


class StepFailed(Exception):
    """A training step carried by a message failed on the node; ``stage`` names it (``"client distillation"``)."""

    def __init__(self, stage: str, err: BaseException) -> None:
        super().__init__(" ".join(f"{type(err).__name__}: {err}".split())[:1000])
        self.stage = stage


def _run_steps(content: RecordDict, run: NodeRun, client: Client, rnd: int) -> dict[str, float]:
    """Run the training steps the message carries (:func:`wire.steps_to_record`), in order, on ``client.model``;
    returns their last-epoch losses as ``{"s<j>.<name>": value}``.

    Raises:
        StepFailed: a step raised (a non-finite loss, ...); the steps after it do not run.
    """
    cfg = dict(content["config"])
    arrays = wire.record_to_tensors(content["arrays"]) if "arrays" in content else {}
    out: dict[str, float] = {}
    for j, (step, target) in enumerate(wire.record_to_steps(cfg, arrays)):
        fn, kwargs = run.steps.train(client, rnd, step, target)
        try:
            losses = fn(**kwargs)
        except Exception as err:
            raise StepFailed(stage_of(step), err) from err
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
    """Run the carried training steps, then reply the float tensors of the client's model (FedAvg only: parameter
    averaging needs them)."""
    rnd = int(content["config"]["round"])
    run, client = _client(context, rnd)
    losses = _run_steps(content, run, client, rnd)
    _keep_working(context, rnd, client.model)
    return RecordDict({"arrays": wire.tensors_to_record(
        {k: v for k, v in client.model.state_dict().items() if v.is_floating_point()}),
        "losses": MetricRecord(losses)})


def load_weights(content: RecordDict, context: Context) -> RecordDict:
    """Run the carried training steps, then load the server's averaged weights (FedAvg; the array record
    ``weights``)."""
    rnd = int(content["config"]["round"])
    run, client = _client(context, rnd)
    losses = _run_steps(content, run, client, rnd)
    client.model.load_state_dict(wire.record_to_tensors(content["weights"]), strict=False)
    _keep_working(context, rnd, client.model)
    return RecordDict({"losses": MetricRecord(losses)})


def scores(content: RecordDict, context: Context) -> RecordDict:
    """End of round: run the carried training steps; roll back to the committed model if the server says the client
    failed the round or a step fails here; score the model on the client's own test (and validation) split; commit
    it. Replies ``{split.model.metric: value}``, the steps' losses, the digest and any failure here."""
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
    for split, (fn, kwargs) in run.steps.evaluate(client, rnd):
        for name, metrics in fn(**kwargs).items():
            out.update({f"{split}.{name}.{k}": float(v) for k, v in metrics.items()})
    digest = _commit(context, rnd, client.model)
    return RecordDict({"metrics": MetricRecord(out), "losses": MetricRecord(losses),
                       "config": ConfigRecord({"digest": digest, **failure})})


def unpack_scores(metrics: MetricRecord) -> dict[str, dict[str, dict[str, float]]]:
    """``{split: {model: {metric: value}}}`` from :func:`scores`' reply (NaN stays NaN: an empty split)."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for key, value in metrics.items():
        split, name, metric = key.split(".")
        out.setdefault(split, {}).setdefault(name, {})[metric] = float(value)
    return out

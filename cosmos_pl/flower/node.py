"""One client on a Flower node: the handlers of the server's messages (content in, content out).

Each handler runs the client steps the message carries (:func:`run_steps`) on the client's model
(:mod:`cosmos_pl.flower.node_state`), built from the run's config and the client's own data
(:mod:`cosmos_pl.flower.node_data`), then answers: ``hello`` sets the node up, ``public`` receives U, ``pseudo_labels``
and ``weights`` upload, ``load_weights`` loads the average, ``scores`` ends the round. A client that failed a round
(the server says so) rolls back to its committed model, as in-process. At the end of an evaluated round the node
scores its model, and the models the server sent for the purpose (its cluster teacher), on its own test and
validation splits: the server never sees them.

What the server sends is checked before the node acts on it: the run token and U's fingerprint become parts of
paths on the node (:func:`~cosmos_pl.flower.node_state.checked_hex`), a teacher must have exactly the model's
floating-point tensors (:func:`sent_models`). In a deployment (the hello's ``mode``) a node serves its own folder
(node config ``data``) or refuses to join.
"""

from __future__ import annotations

import torch
from flwr.app import ConfigRecord, Context, MetricRecord, RecordDict

from cosmos_pl.communication import CommunicationConfig
from cosmos_pl.errors import ConfigError
from cosmos_pl.files import atomic_save
from cosmos_pl.flower import wire
from cosmos_pl.flower.node_data import NodeRun, SiteDataError, load_run
from cosmos_pl.flower.node_state import (COMMITTED, META, SITE_KEYS, WORKING, NotSetUp, check_node_config,
                                         check_site_folder, checked_hex, commit, current_client, data_cache, identity,
                                         keep_working, meta_record, model_digest, node_site, state_dir, state_file)
from cosmos_pl.models import create_backbone
from cosmos_pl.models.personal import load_shared_weights, shared_weights
from cosmos_pl.objectives.runtime import encode_upload
from cosmos_pl.objectives.wire import steps_from_wire
from cosmos_pl.training.client import Client
from cosmos_pl.uploads import public_fingerprint

__all__ = ["MODES", "NotSetUp", "SiteDataError", "StepFailed", "hello", "load_weights", "public", "pseudo_labels",
           "run_steps", "scores", "sent_models", "weights"]

#: The hello's ``mode``: a deployment (each node serves its own folder, node config ``data``) or a simulation (each
#: node takes its partition of the data set the run config names). A hello without it is a simulation's.
MODES = ("deployment", "simulation")


# --------------------------------------------------------------------------- handlers (content -> content)
def hello(content: RecordDict, context: Context) -> RecordDict:
    """Set the node up for the run: build its client (``partition-id``) and load its committed model from disk
    (a restarted node) or create the round-0 model.

    Reads the server's config: ``config_yaml``, ``run_token``, ``public_fingerprint``, ``mode`` (``deployment`` or
    ``simulation``; a simulation's when missing) and, for a site (node config ``data``), ``classes`` and
    ``public_shape``. Replies ``client_id``, ``committed_round``, ``digest``, ``public_fingerprint``, ``backbone``,
    ``train_size``, ``test_size``, ``validation_size``, ``parameters``, ``has_public``, ``identity`` and
    ``data_mode`` (``site`` with node config ``data``, else ``partition``).

    Raises:
        ConfigError: an unknown node config key (:func:`check_node_config`), no ``partition-id`` in the node
            config, or one out of range; an unknown ``mode``; a deployment's node without ``data``; a ``data``
            folder that is not there or not readable (:func:`check_site_folder`).
        ValueError: a run token or U fingerprint that is not hex (:func:`checked_hex`); the server's public set U
            is not the one this node built.
        SiteDataError: the site's folder holds data that cannot be used for the run.
    """
    check_node_config(context.node_config)  # before the run is built: a typo is refused in a moment
    cfg = content["config"]
    pid = context.node_config.get("partition-id")
    if pid is None:
        raise ConfigError("node config partition-id=None: give each node its own client, 0..N-1 "
                          "(flower-supernode --node-config 'partition-id=0')")
    cid = int(pid)
    mode = str(cfg.get("mode", "simulation"))
    if mode not in MODES:
        raise ConfigError(f"the server sent mode={mode!r}: expected one of {', '.join(MODES)} (a server of another "
                          "cosmos-pl version?); run the same version on both")
    folder = context.node_config.get("data")
    if mode == "deployment" and not folder:
        raise ConfigError("node config has no data=<folder>: in a deployment each site serves its own data "
                          "(flower-supernode --node-config \"partition-id=0 data='/srv/site_0'\"); this node would "
                          "build the whole federation from the data set the run config names, so it refuses to join")
    token = checked_hex("run_token", cfg["run_token"])
    checked_hex("public_fingerprint", cfg["public_fingerprint"])
    if folder:
        check_site_folder(str(folder))  # a refused join, before any data are read
    site = node_site(context, cfg)
    run = load_run(str(cfg["config_yaml"]), cid, data_cache(context), site)  # refuses a pid outside 0..N-1
    if site is None and run.fingerprint != str(cfg["public_fingerprint"]):
        raise ValueError(f"public set U differs: this node built U with fingerprint {run.fingerprint}, the server "
                         f"{cfg['public_fingerprint']}; give the node the same data and cosmos-pl version")
    meta = context.state.get(META)
    if meta is None or str(meta["run_token"]) != token or int(meta["client_id"]) != cid:
        path = state_file(context, token, cid)
        if path.is_file():  # a restarted node: continue from its last committed round
            saved = torch.load(path, weights_only=True)
            state, committed, digest = saved["model"], int(saved["round"]), str(saved["digest"])
        else:
            state = run.initial_state  # from the disk cache: a joining node does not build (or import) the model
            committed, digest = -1, model_digest(state)
        context.state[COMMITTED] = wire.tensors_to_record(state)
        context.state[WORKING] = context.state[COMMITTED]
        context.state[META] = ConfigRecord({"config_yaml": str(cfg["config_yaml"]), "run_token": token,
                                             "client_id": cid, "committed_round": committed,
                                             "working_round": committed, "digest": digest,
                                             **{k: cfg[k] for k in SITE_KEYS if k in cfg}})
    meta = context.state[META]
    d = run.data
    return RecordDict({"config": ConfigRecord({
        "client_id": cid, "committed_round": int(meta["committed_round"]), "digest": str(meta["digest"]),
        "public_fingerprint": run.fingerprint, "backbone": run.backbone(cid), "train_size": len(d.y),
        "test_size": len(d.y_test), "validation_size": 0 if d.y_val is None else len(d.y_val),
        "parameters": run.parameters, "has_public": run.public is not None, "identity": identity(context),
        "data_mode": "partition" if site is None else "site"})})


def public(content: RecordDict, context: Context) -> RecordDict:
    """A chunk of U from the server (a site that did not have it: ``query.public``): rows ``[start, start + k)`` of
    U ``[n, C, H, W]`` uint8. Kept on the node's disk; once the last has arrived, U is checked against its
    fingerprint and kept as ``state-dir/public/<fingerprint>.pt``, for every later run with the same U.

    Raises:
        ValueError: the fingerprint is not hex (:func:`checked_hex`: it names files on this node); the chunks do not
            make U (another fingerprint, missing rows).
    """
    cfg = content["config"]
    fp, start, total = checked_hex("public_fingerprint", cfg["public_fingerprint"]), int(cfg["start"]), int(cfg["rows"])
    parts = state_dir(context) / "public" / f"{fp}.parts"
    chunk = wire.record_to_tensors(content["arrays"])["x"]
    atomic_save(chunk, parts / f"{start:012d}.pt")
    stored = False
    if start + len(chunk) == total:  # the last chunk: U whole, or an error
        pieces = [torch.load(p, weights_only=True) for p in sorted(parts.glob("*.pt"))]
        x = torch.cat(pieces) if pieces else torch.zeros(0)
        if len(x) != total or public_fingerprint(x) != fp:
            raise ValueError(f"U arrived with {len(x)} of {total} rows and fingerprint {public_fingerprint(x)}, not "
                             f"{fp}: the server sends it again")
        atomic_save(x, state_dir(context) / "public" / f"{fp}.pt")
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


def run_steps(content: RecordDict, run: NodeRun, client: Client, rnd: int) -> dict[str, float]:
    """Run the training steps the message carries (:func:`cosmos_pl.objectives.wire.steps_to_wire`), in order, on
    ``client.model``; returns their last-epoch losses as ``{"s<j>.<name>": value}``.

    Raises:
        StepFailed: a step raised (a non-finite loss, ...); the steps after it do not run.
    """
    cfg = dict(content["config"])
    arrays = wire.record_to_tensors(content["arrays"]) if "arrays" in content else {}
    out: dict[str, float] = {}
    for j, (step, target) in enumerate(steps_from_wire(cfg, arrays)):
        fn, kwargs = run.runtime.train(client, rnd, step, target)
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
    run, client = current_client(context, rnd)
    if str(cfg["public_fingerprint"]) != run.fingerprint:
        raise ValueError(f"round {rnd}: the server asks for pseudo-labels on U with fingerprint "
                         f"{cfg['public_fingerprint']}, this node holds {run.fingerprint}; not answering")
    losses = run_steps(content, run, client, rnd)
    keep_working(context, rnd, client.model)
    top_k = int(cfg["top_k"]) if int(cfg["top_k"]) > 0 else None
    fn, kwargs = run.runtime.predict(client, rnd)
    payload = encode_upload(fn(**kwargs), str(cfg["kind"]), CommunicationConfig(str(cfg["dtype"]), top_k),
                            run.fingerprint)
    arrays, meta = wire.payload_to_record(payload)
    return RecordDict({"arrays": arrays, "config": ConfigRecord(meta), "losses": MetricRecord(losses)})


def weights(content: RecordDict, context: Context) -> RecordDict:
    """Run the carried training steps, then reply the float tensors the client shares for parameter averaging
    (FedAvg, Ditto, FedBABU: :func:`~cosmos_pl.models.personal.shared_weights`)."""
    rnd = int(content["config"]["round"])
    run, client = current_client(context, rnd)
    losses = run_steps(content, run, client, rnd)
    keep_working(context, rnd, client.model)
    return RecordDict({"arrays": wire.tensors_to_record(shared_weights(client.model)),
        "losses": MetricRecord(losses)})


def load_weights(content: RecordDict, context: Context) -> RecordDict:
    """Run the carried training steps, then load the server's averaged weights (FedAvg; the array record
    ``weights``)."""
    rnd = int(content["config"]["round"])
    run, client = current_client(context, rnd)
    losses = run_steps(content, run, client, rnd)
    load_shared_weights(client.model, wire.record_to_tensors(content["weights"]))
    keep_working(context, rnd, client.model)
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
    meta = meta_record(context)
    run, client = current_client(context, rnd)
    failure: dict[str, str] = {}
    losses: dict[str, float] = {}
    if not bool(cfg["failed"]):
        try:
            losses = run_steps(content, run, client, rnd)
        except StepFailed as err:
            failure = {"failed_step": err.stage, "failure": str(err)}
    if bool(cfg["failed"]) or failure:
        meta["working_round"] = int(meta["committed_round"])  # back to the model from the round's start
        run, client = current_client(context, rnd)
    per_split: dict[str, dict[str, dict[str, float]]] = {}
    if bool(cfg.get("evaluate", True)):
        sent = sent_models(content, run)
        for split, (fn, kwargs) in run.runtime.evaluate(client, rnd, {"client": client.model, **sent}):
            per_split[split] = fn(**kwargs)
        if bool(cfg.get("final", False)):  # the personalized model the client goes on with (COSMOS: its teacher)
            for name, model in sent.items():
                atomic_save({"backbone": str(cfg[f"eval.{name}.backbone"]), "model": model.state_dict()},
                            state_file(context, str(meta["run_token"]), int(meta["client_id"])).with_name(
                                f"{name}_model.pt"))
    digest = commit(context, rnd, client.model)
    return RecordDict({"metrics": MetricRecord(wire.pack_scores(per_split)), "losses": MetricRecord(losses),
                       "config": ConfigRecord({"digest": digest, **failure})})


def sent_models(content: RecordDict, run: NodeRun) -> dict[str, torch.nn.Module]:
    """The models the server sent to be scored here (``eval.<name>``: the architecture's name in the config
    ``eval.<name>.backbone``, and the array record ``eval.<name>`` of its floating-point state-dict tensors; e.g.
    COSMOS's cluster teacher of this client), built for the run's images. The non-float buffers (BatchNorm's
    ``num_batches_tracked``) are not sent: they keep the new model's values.

    Raises:
        ValueError: the tensors sent are not exactly the model's floating-point ones with their shapes (naming the
            model, the missing and unexpected names and the shape mismatches): the client fails the round with it.
    """
    cfg = content["config"]
    out = {}
    for name in [n for n in str(cfg.get("eval", "")).split(",") if n]:
        backbone = str(cfg[f"eval.{name}.backbone"])
        model = create_backbone(backbone, run.num_classes, run.in_chans, max(run.image_shape))
        sent = wire.record_to_tensors(content[f"eval.{name}"])
        expected = {k: v for k, v in model.state_dict().items() if v.is_floating_point()}
        missing = sorted(set(expected) - set(sent))
        unexpected = sorted(set(sent) - set(expected))
        shapes = [f"{k} {tuple(sent[k].shape)} (the model's {tuple(expected[k].shape)})" for k in sorted(expected)
                  if k in sent and tuple(sent[k].shape) != tuple(expected[k].shape)]
        wrong = [_few(what, items) for what, items in (("missing", missing), ("unexpected", unexpected),
                                                       ("of another shape", shapes)) if items]
        if wrong:
            raise ValueError(f"eval.{name}: the server sent tensors that do not fit its architecture {backbone} for "
                             f"this run: {'; '.join(wrong)}; not scoring it (a server of another cosmos-pl version?)")
        model.load_state_dict(sent, strict=False)  # only the non-float buffers, which are not sent, are left out
        out[name] = model
    return out


def _few(what: str, items: list[str], shown: int = 3) -> str:
    """``"<count> <what> (<the first few items>, ...)"``, for an error line."""
    return f"{len(items)} {what} ({', '.join(items[:shown])}{', ...' if len(items) > shown else ''})"

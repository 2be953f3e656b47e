"""The clients of a deployment: each on its own Flower node, behind the same interface as in-process clients.

:class:`FlowerClients` implements :class:`~cosmos_pl.federated.clients.Clients`: the round loop
(:class:`~cosmos_pl.federated.runner.Runner`) is the one every transport runs. Each message goes out with
``grid.send_and_receive``; an error reply or a missing reply (``reply_timeout_s``) fails that client for the round with
the reason, and the round goes on with the others (``failures``). A client's training steps are queued and ride on
its next message (two messages per client and round). At the end of a round each node scores its own model and the
models the server sends it for the purpose (COSMOS: its cluster teacher, as its architecture's name and weights),
on its own test and validation splits, and commits its model; those weights are counted as ``evaluation`` bytes,
apart from the protocol's. The server holds no client's data or model.

Nodes join by ``query.hello`` (before round 0, then at the start of every round for new or restarted nodes): a node
says which client it holds, its architecture and sizes, the round its model was last committed and that model's
digest; the server records, and prints, whether the digest is the one the client reported when it last committed
(``nodes.json``; :mod:`cosmos_pl.flower.joining`). Every message's bytes are recorded per client and round
(``traffic.csv``).
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Optional

import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict
from torch import nn

from cosmos_pl.errors import ConfigError
from cosmos_pl.federated.clients import ClientInfo, Clients, Scores
from cosmos_pl.execution.task_failure import TaskFailure
from cosmos_pl.runs.recorder import format_csv
from cosmos_pl.federated.server_view import ServerView
from cosmos_pl.federated.initial_models import client_backbone
from cosmos_pl.flower import validate, wire
from cosmos_pl.flower.bindings import SiteKeys
from cosmos_pl.flower.joining import NodeJoining
from cosmos_pl.flower.replies import NodeRestarted, NoReply, read_reply
from cosmos_pl.objectives.runtime import encode_upload
from cosmos_pl.objectives.step import ClientStep
from cosmos_pl.objectives.wire import steps_to_wire

__all__ = ["FlowerClients"]


class FlowerClients(NodeJoining, Clients):
    """The run's clients on Flower nodes (see the module docstring); joins them before returning.

    Args:
        view: what the clients are given of the server (:class:`~cosmos_pl.federated.server_view.ServerView`: U and
            its fingerprint, the class list, upload encoding, console, records, timer, reply timeout, the reference
            weights, where late losses are reported).
        grid: the ServerApp's ``Grid``.
        config_yaml: the run's resolved config, sent to every node in ``query.hello``.
        num_clients: N, the clients to wait for (one node each).
        reply_timeout_s: seconds to wait for the replies of one message, which may carry several training steps
            (default ``failures.timeout_s``, else no limit: a node that stops is reported by the SuperLink once it
            misses its heartbeats, about a minute); a node that has not replied by then fails the step.
        join_timeout_s: seconds to wait before round 0 for one node per client.
        rejoin_timeout_s: seconds to wait at the start of a later round for the clients whose node left (0: none);
            it stops as soon as each client has a node again. With SuperNode authentication a restarted node can
            only come back once the SuperLink has marked its old session offline (2 missed heartbeats of 30 s).
        mode: ``"deployment"`` (each node serves its own site folder; its hello must say ``data_mode`` ``site``) or
            ``"simulation"`` (each node takes its partition of the configured data set: ``partition``).
        site_keys: the operator's binding of client ids to SuperNode keys (:mod:`cosmos_pl.flower.bindings`), checked
            on every join; None: a client id stays with the node token that first held it (printed once in a
            deployment: client ids are then not bound to keys).

    Raises:
        NodesMissing: a client has no node when the join before round 0 stops waiting
            (:class:`~cosmos_pl.flower.replies.NodesMissing`).
    """

    def __init__(self, view: ServerView, *, grid: Any, config_yaml: str, num_clients: int,
                 reply_timeout_s: Optional[float] = None, join_timeout_s: float = 600.0,
                 rejoin_timeout_s: float = 0.0, mode: str = "simulation", site_keys: Optional[SiteKeys] = None) -> None:
        if mode not in ("deployment", "simulation"):
            raise ValueError(f"mode={mode!r}: 'deployment' or 'simulation'")
        self.view, self.grid, self.config_yaml, self.n = view, grid, config_yaml, num_clients
        self.mode, self.site_keys = mode, site_keys
        self.expected = validate.HelloExpected(
            num_clients, view.rounds, view.fingerprint,
            lambda c: client_backbone(view.runtime.clients.backbones, c),
            "site" if mode == "deployment" else "partition")
        self.console, self.recorder = view.console, view.recorder
        timeout = reply_timeout_s or view.reply_timeout_s
        self.reply_timeout_s: Optional[float] = float(timeout) if timeout else None
        self.join_timeout_s, self.rejoin_timeout_s = join_timeout_s, rejoin_timeout_s
        # names this run on the nodes' disks: a restarted node finds its model, a new run starts from round 0
        self.run_token = uuid.uuid4().hex[:16]
        self.node_of: dict[int, int] = {}  # client id -> node id
        self.reported: dict[int, tuple[int, str]] = {}  # client id -> (round, digest) of its last commit
        self.described: dict[int, ClientInfo] = {}
        self._pending: dict[int, list] = {}  # client id -> training steps to send with its next message
        self._failed: set[int] = set()  # clients failed this round (their node rolls back at its end)
        self.extra_bytes: dict[str, dict[int, int]] = {"evaluation": {}, "setup": {}}  # this round's bytes per client
        self.traffic: list[dict[str, Any]] = []
        self.joins: list[dict[str, Any]] = []
        self.join_failures: list[dict[str, Any]] = []  # the nodes that refused to join: round, node id, reason
        self.broken: dict[int, str] = {}  # clients whose site's data cannot be used: why
        self.identity_of: dict[int, str] = {}  # client id -> the identity of the node that first held it
        self.needs_public: set[int] = set()  # sites that have not got U yet
        if mode == "deployment" and site_keys is None:
            self.console.print("cosmos-pl: client ids are not bound to keys (no run config 'sites'): a node's "
                               "partition-id and token are taken as it says them; name each client's key in a "
                               "sites.toml under SuperNode authentication")
        self.join(0, wait=True)
        self.infos = [self.described[i] for i in range(self.n)]

    # ----------------------------------------------------------------- messages
    def send(self, message_type: str, contents: dict[int, RecordDict],
             timeout: Optional[float] = None) -> dict[int, Any]:
        """One message per node; ``{node id: reply content or TaskFailure}`` (``timeout``: default
        ``reply_timeout_s``). A reply that cannot be read, or none in time (:class:`NoReply`), is a TaskFailure."""
        nodes = list(contents)
        messages = [Message(contents[n], dst_node_id=n, message_type=message_type) for n in nodes]
        out: dict[int, Any] = {}
        timeout = self.reply_timeout_s if timeout is None else timeout
        replies = list(self.grid.send_and_receive(messages, timeout=timeout)) if messages else []
        # by message id: an error the SuperLink writes for a lost node comes from the SuperLink, not the node
        sent = {m.metadata.message_id: node_id for m, node_id in zip(messages, nodes)}
        for reply in replies:
            src = sent.get(reply.metadata.reply_to_message_id)
            if src is None:  # a late reply to an earlier message
                continue
            try:
                if reply.has_error():
                    out[src] = TaskFailure(f"Flower error {reply.error.code}: {str(reply.error.reason)[:1000]}")
                else:
                    out[src] = read_reply(reply.content, self.n)
            except Exception as err:  # noqa: BLE001 - a reply that cannot even be read fails its client only
                out[src] = TaskFailure(validate.rejection(err))
        for node_id in nodes:
            if node_id not in out:
                out[node_id] = NoReply(f"node {node_id} sent no reply within {timeout or 0:g} s (stopped or "
                                       "unreachable)")
        return out

    def _exchange(self, rnd: int, stage: str, message_type: str,
                  requests: dict[int, tuple[dict[str, Any], dict[str, Any]]]) -> dict[int, Any]:
        """Send each listed client's request ``(config, arrays)`` to its node, with the training steps queued for it;
        ``{client id: reply content or TaskFailure}``. The queued steps' losses go to the round's records; bytes each
        way are recorded per client (``traffic.csv``); arrays named ``eval.*`` are evaluation bytes. A client whose
        node did not reply loses its node (it is greeted again at the start of the next round)."""
        start = time.perf_counter()
        out: dict[int, Any] = {}
        contents, by_node, carried = {}, {}, {}
        for cid, (config, tensors) in requests.items():
            steps = self._pending.pop(cid, [])
            if cid in self.broken:  # nothing to ask: its site's data cannot be used
                out[cid] = TaskFailure(f"its site's data cannot be used: {self.broken[cid]}",
                                       steps[0][0].stage if steps else None)
                continue
            if cid not in self.node_of:
                out[cid] = TaskFailure("no node holds this client (it left and has not rejoined)",
                                       steps[0][0].stage if steps else None)
                continue
            step_config, step_arrays = steps_to_wire(steps)
            content = RecordDict({"config": ConfigRecord({"round": rnd, **config, **step_config})})
            arrays = {**tensors, **step_arrays}
            records = {k: wire.tensors_to_record(v) for k, v in arrays.items() if isinstance(v, dict)}  # weights
            flat = {k: v for k, v in arrays.items() if not isinstance(v, dict)}
            if flat:
                records["arrays"] = wire.tensors_to_record(flat)
            for name, record in records.items():
                content[name] = record
            node_id = self.node_of[cid]
            contents[node_id], by_node[node_id], carried[cid] = content, cid, (steps, records)
        for node_id, reply in self.send(message_type, contents).items():
            cid = by_node[node_id]
            steps, records = carried[cid]
            failed = isinstance(reply, TaskFailure)
            # the node is gone (no reply), or restarted under its old id: it is greeted again next round
            left = failed and (isinstance(reply, (NodeRestarted, NoReply)) or reply.reason.startswith("Flower error"))
            if left and reply.step is None and steps:
                reply = TaskFailure(reply.reason, steps[0][0].stage)  # no reply: the first carried step is unfinished
            out[cid] = reply
            if not failed and steps:
                try:
                    self._keep_losses(rnd, cid, steps, validate.losses(reply, len(steps)))
                except Exception as err:  # noqa: BLE001 - a malformed reply (another version, a hostile node)
                    reply = out[cid] = TaskFailure(validate.rejection(err), steps[0][0].stage)
                    failed = True
            sent = {k: wire.array_bytes(r) for k, r in records.items()}
            protocol = [b for k, b in sent.items() if not k.startswith("eval.")]
            evaluation = sum(b[0] for k, b in sent.items() if k.startswith("eval."))
            self.extra_bytes["evaluation"][cid] = self.extra_bytes["evaluation"].get(cid, 0) + evaluation
            try:
                received = [] if failed else [wire.array_bytes(reply[k]) for k in ("arrays",) if k in reply]
            except Exception:  # noqa: BLE001 - not an array record: rejected where it is used
                received = []
            self.traffic.append({
                "round": rnd, "client": cid, "message": message_type,
                "stages": "+".join([st.stage for st, _ in steps] + [stage]),
                "sent_bytes": sum(b[0] for b in protocol), "sent_serialized_bytes": sum(b[1] for b in protocol),
                "received_bytes": sum(b[0] for b in received),
                "received_serialized_bytes": sum(b[1] for b in received), "evaluation_bytes": evaluation,
                "ok": not failed})
            if left:
                self.node_of.pop(cid, None)
        if self.recorder.run_dir is not None:
            self.recorder.run_dir.write_text("traffic.csv", format_csv(self.traffic))
        self.view.run_tasks.timer.add(rnd, stage, time.perf_counter() - start)
        return out

    def _keep_losses(self, rnd: int, cid: int, steps: list, losses: list[dict[str, float]]) -> None:
        """Report the carried steps' checked losses (:func:`cosmos_pl.flower.validate.losses`: one dict per step)."""
        self.view.report_losses(rnd, [(step.stage, cid, parts) for (step, _), parts in zip(steps, losses) if parts])

    # ----------------------------------------------------------------- the interface
    def begin_round(self, rnd: int) -> None:
        self._failed = set()
        self.extra_bytes = {"evaluation": {}, "setup": dict(self.extra_bytes["setup"]) if rnd == 0 else {}}
        if rnd > 0:
            refused: dict[int, str] = {}  # asked once per round start: a hello starts a ClientApp on the node
            self.join(rnd, wait=False, refused=refused)  # nodes restarted since the last round rejoin here
            deadline = time.monotonic() + self.rejoin_timeout_s
            if len(self.node_of) < self.n and self.rejoin_timeout_s > 0:
                missing = sorted(set(range(self.n)) - set(self.node_of))
                self.console.print(f"round {rnd}: waiting up to rejoin-timeout={self.rejoin_timeout_s:g} s for the "
                                   f"node{'s' if len(missing) > 1 else ''} of client{'s' if len(missing) > 1 else ''} "
                                   f"{', '.join(map(str, missing))}")
            while len(self.node_of) < self.n and time.monotonic() < deadline:
                time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
                self.join(rnd, wait=False, refused=refused)

    def train(self, rnd: int, step: ClientStep, ids: list[int], targets: dict[int, Any]) -> dict[int, Any]:
        """Queue the step for each client: it travels with the client's next message, which replies its losses
        (or its failure, recorded then under this step's stage)."""
        for i in ids:
            self._pending.setdefault(i, []).append((step, targets[i] if step.needs_target else None))
        return {i: [] for i in ids}

    def pretrain(self, epochs: int, cache: Any = None, key: str = "") -> dict[int, Any]:
        """Round 0 on the nodes (no round-0 cache: the models are theirs)."""
        from cosmos_pl.objectives.local_fit import LocalFit  # Lightning: the server trains teachers later anyway

        return self.train(0, LocalFit(epochs), list(range(self.n)), {}) if epochs > 0 else {}

    def upload(self, rnd: int, kind: str, ids: list[int]) -> dict[int, Any]:
        """The arrays each node sent, their declared names, shapes and dtypes checked before any is decoded
        (:func:`wire.check_declared`)."""
        if kind == "weights":
            out = {}
            for i, r in self._exchange(rnd, "weights", wire.WEIGHTS, {i: ({}, {}) for i in ids}).items():
                try:
                    if not isinstance(r, TaskFailure):
                        wire.check_declared(validate.record(r, "arrays", ArrayRecord),
                                            {k: (tuple(v.shape), str(v.numpy().dtype)) for k, v in
                                             self.view.reference(i).items()})
                    out[i] = r if isinstance(r, TaskFailure) else wire.record_to_tensors(r["arrays"])
                except Exception as err:  # noqa: BLE001 - whatever a node sends, it fails only its client
                    out[i] = TaskFailure(validate.rejection(err, "upload"), "upload")
            return out
        comm, server = self.view.communication, self.view.data
        config = {"kind": kind, "dtype": comm.upload_dtype, "top_k": comm.top_k or 0,
                  "public_fingerprint": self.view.fingerprint}
        # what an honest upload declares: the encoding of [n, M] pseudo-labels
        honest = encode_upload(torch.full((len(self.view.public), server.num_classes), 1.0 / server.num_classes),
                               kind, comm, self.view.fingerprint)
        expected = {k: (tuple(t.shape), str(t.numpy().dtype)) for k, t in
                    (("values", honest.values), ("indices", honest.indices)) if t is not None}
        out: dict[int, Any] = {}
        for i, r in self._exchange(rnd, "pseudo-labels", wire.PSEUDO_LABELS, {i: (config, {}) for i in ids}).items():
            if isinstance(r, TaskFailure):
                out[i] = TaskFailure(r.reason, r.step or "pseudo-labels")
                continue
            try:
                declared = validate.upload_config(r, server.num_classes, comm.upload_dtype)
                wire.check_declared(r["arrays"], expected)
                out[i] = wire.record_to_payload(r["arrays"], declared)
            except Exception as err:  # noqa: BLE001 - malformed: rejected like a bad upload, its client only
                out[i] = TaskFailure(validate.rejection(err, "upload"), "upload")
        return out

    def load_weights(self, rnd: int, states: dict[int, dict[str, Any]]) -> dict[int, Any]:
        replies = self._exchange(rnd, "load weights", wire.LOAD_WEIGHTS,
                                 {i: ({}, {"weights": dict(s)}) for i, s in states.items()})
        return {i: r if isinstance(r, TaskFailure) else None for i, r in replies.items()}

    def fail(self, rnd: int, client: int) -> None:
        self._failed.add(client)  # its node rolls back to its committed model at the end of the round

    def end_round(self, rnd: int, models: dict[int, dict[str, nn.Module]], *,
                  evaluate: bool) -> tuple[Scores, dict[int, Any]]:
        """Each node runs its queued steps, keeps its model (or rolls back: the server says so, or a step failed
        there) and, with ``evaluate``, scores its own f_i and the models sent with the message on its own splits."""
        requests = {}
        for c in range(self.n):
            config: dict[str, Any] = {"failed": c in self._failed, "evaluate": evaluate,
                                      "final": rnd == self.view.rounds}
            tensors: dict[str, Any] = {}
            for name, model in (models.get(c, {}) if evaluate else {}).items():
                config[f"eval.{name}.backbone"] = str(getattr(model, "backbone_name"))
                tensors[f"eval.{name}"] = {k: v.detach().cpu() for k, v in model.state_dict().items()
                                           if v.is_floating_point()}
            config["eval"] = ",".join(sorted(models.get(c, {}))) if evaluate else ""
            requests[c] = (config, tensors)
        replies = self._exchange(rnd, "evaluation", wire.SCORES, requests)
        scores: Scores = {}
        failures: dict[int, Any] = {}
        for cid, reply in replies.items():
            if not isinstance(reply, TaskFailure):
                try:
                    per_split, digest, failed_step = validate.scores(reply, models.get(cid, {}) if evaluate else ())
                except Exception as err:  # noqa: BLE001 - another version's reply, or a hostile one
                    reply = TaskFailure(validate.rejection(err))
                else:
                    self.reported[cid] = (rnd, digest)
                    scores.update({(cid, split): named for split, named in per_split.items()})
                    if failed_step is not None:  # a queued step failed on the node: the client failed the round
                        failures[cid] = TaskFailure(failed_step[1], failed_step[0])
                    continue
            if cid not in self._failed:
                failures[cid] = TaskFailure(reply.reason, reply.step or "evaluation")
        return scores, failures

    def bytes(self, rnd: int) -> dict[str, int]:
        return {kind: max(per.values(), default=0) for kind, per in self.extra_bytes.items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Raises ConfigError: a run over Flower is not resumed (its client models live on the nodes)."""
        raise ConfigError("--resume: a run over Flower cannot be resumed (the client models live on the nodes, which "
                          "start a new run from round 0); start a new run")

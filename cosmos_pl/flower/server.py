"""The server side over Flower: the same runner, with client steps sent to nodes instead of the executor.

:class:`FlowerRunner` overrides only the runner's four transport methods (train, uploads, load weights, scores);
the round loop, upload checks, aggregation, teachers, records and checkpoints are :class:`Runner`'s. Each message
goes out with ``grid.send_and_receive``; an error reply or a missing reply (``reply_timeout_s``) fails that client
for the round with the reason, and the round goes on with the others (``failures``).

Nodes join by ``query.hello`` at the start of every round: a node the server has not seen (a new one, or one
restarted after a crash, which comes back under a new node id) says which client it holds, the round its model
was last committed and that model's digest; the server records, and prints, whether the digest is the one the
client reported when it last committed (``nodes.json``). A node whose scores reply was lost still commits its model,
so such a client may rejoin with a newer model than the server recorded: the join says so. Every message's bytes are recorded per client and round (``traffic.csv``).
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Optional

from flwr.app import ConfigRecord, Message, RecordDict

from cosmos_pl.algorithms.base import LocalFit
from cosmos_pl.errors import ConfigError, UserError
from cosmos_pl.federated.client_steps import stage_of
from cosmos_pl.federated.executor import TaskFailure
from cosmos_pl.federated.recorder import format_csv
from cosmos_pl.federated.runner import Runner
from cosmos_pl.flower import wire
from cosmos_pl.flower.node import unpack_scores

__all__ = ["FlowerRunner", "NodesMissing"]


class NodesMissing(UserError):
    """Fewer nodes than clients joined before round 0: ``join_timeout_s`` passed, or every connected node answered
    and some refused."""


class FlowerRunner(Runner):
    """A :class:`Runner` whose clients live on Flower nodes.

    Args (besides :class:`Runner`'s):
        grid: the ServerApp's ``Grid``.
        config_yaml: the run's resolved config, sent to every node in ``query.hello``.
        reply_timeout_s: seconds to wait for the replies of one message, which may carry several training steps
            (default ``failures.timeout_s``, else no limit: a node that stops is reported by the SuperLink once it
            misses its heartbeats, about a minute); a node that has not replied by then fails the step.
        join_timeout_s: seconds to wait before round 0 for one node per client.
    """

    def __init__(self, *args: Any, grid: Any, config_yaml: str, reply_timeout_s: Optional[float] = None,
                 join_timeout_s: float = 600.0, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.grid, self.config_yaml = grid, config_yaml
        timeout = reply_timeout_s or self.failure_cfg.timeout_s
        self.reply_timeout_s: Optional[float] = float(timeout) if timeout else None
        self.join_timeout_s = join_timeout_s
        # names this run on the nodes' disks: a restarted node finds its model, a new run starts from round 0
        self.run_token = uuid.uuid4().hex[:16]
        self.node_of: dict[int, int] = {}  # client id -> node id
        self.reported: dict[int, tuple[int, str]] = {}  # client id -> (round, digest) of its last commit
        self._pending: dict[int, list] = {}  # client id -> training steps to send with its next message
        self.traffic: list[dict[str, Any]] = []
        self.joins: list[dict[str, Any]] = []
        self.join_failures: list[dict[str, Any]] = []  # the nodes that refused to join: round, node id, reason

    # ----------------------------------------------------------------- nodes
    def _join(self, rnd: int, wait: bool) -> None:
        """Greet every node the server has not seen yet; with ``wait``, until each client has a node.

        With ``wait`` it stops waiting at ``join_timeout_s``, or earlier once at least as many nodes as clients are
        connected and every one of them has answered, some refusing (a wrong ``partition-id``, an unknown node config
        key, a client held twice): a misconfigured node fails the run in the time a hello takes, not the whole
        join timeout.

        Raises:
            NodesMissing: with ``wait``, a client has no node when it stops waiting; says which clients are missing,
                how long it waited and why it stopped, and the first refusal's reason.
        """
        start = time.monotonic()
        deadline = start + (self.join_timeout_s if wait else 0.0)
        n = len(self.clients)
        refused: dict[int, str] = {}  # node id -> why it could not join (asked once per call)
        while True:
            present = set(self.grid.get_node_ids())
            for cid in [c for c, node in self.node_of.items() if node not in present]:
                del self.node_of[cid]  # its node left
            new = sorted(present - set(self.node_of.values()) - set(refused))  # online nodes only (Flower)
            if new:
                config = {"config_yaml": self.config_yaml, "public_fingerprint": self.fingerprint,
                          "run_token": self.run_token}
                hello = RecordDict({"config": ConfigRecord(config)})
                # a node's first message starts its ClientApp (imports, data): before round 0 it may take the whole
                # join timeout; later (a restarted node) the reply timeout
                timeout = max(1.0, deadline - time.monotonic()) if wait else self.reply_timeout_s
                for node_id, reply in self._send(wire.HELLO, {node: hello for node in new}, timeout).items():
                    reason = self._greeted(rnd, node_id, reply)
                    if reason and not reason.startswith("node "):  # a refusal; a node that did not reply is asked again
                        refused[node_id] = reason
                        self.join_failures.append({"round": rnd, "node_id": node_id, "reason": reason})
                        self._write_nodes()
            if not wait or len(self.node_of) == n:
                return
            now = time.monotonic()
            waited = now - start
            answered = len(present) >= n and len(self.node_of) + len(refused) >= len(present)
            if answered or now >= deadline:
                missing = sorted(set(range(n)) - set(self.node_of))
                if answered:
                    why = (f"all {len(present)} connected nodes answered within {waited:.1f} s and {len(refused)} "
                           f"refused, so the server stopped waiting before join-timeout={self.join_timeout_s:g} s")
                else:
                    why = (f"waited the whole join-timeout={self.join_timeout_s:g} s ({waited:.1f} s) with "
                           f"{len(present)} node{'s' if len(present) != 1 else ''} connected")
                first = next(iter(refused.items()), None)
                refusal = "" if first is None else f"; node {first[0]} could not join: {first[1]}"
                raise NodesMissing(f"only {len(self.node_of)} of {n} clients joined (missing: {missing}): {why}; "
                                   f"start one SuperNode per client with --node-config 'partition-id=<client>' "
                                   f"against this SuperLink{refusal}")
            time.sleep(max(0.0, min(1.0, deadline - time.monotonic())))

    def _write_nodes(self) -> None:
        self.recorder.write_json("nodes.json", {"clients": {str(c): n for c, n in sorted(self.node_of.items())},
                                                "joins": self.joins, "join_failures": self.join_failures})

    def _greeted(self, rnd: int, node_id: int, reply: Any) -> Optional[str]:
        """Record a node's hello reply; returns why it could not join, or None."""
        if isinstance(reply, TaskFailure):
            self.console.print(f"round {rnd}: node {node_id} could not join: {reply.reason}")
            return reply.reason
        info = reply["config"]
        cid = int(info["client_id"])
        if cid in self.node_of:
            reason = f"client {cid} is already held by node {self.node_of[cid]}, and node {node_id} says it holds it too"
            self.console.print(f"round {rnd}: {reason}; ignoring it (give each node its own partition-id)")
            return reason
        self.node_of[cid] = node_id
        committed, digest = int(info["committed_round"]), str(info["digest"])
        last = self.reported.get(cid)
        intact = None if last is None else last == (committed, digest)
        self.joins.append({"round": rnd, "client": cid, "node_id": node_id, "committed_round": committed,
                           "digest": digest, "last_reported": None if last is None else list(last), "intact": intact})
        self._write_nodes()
        if last is not None:
            state = "intact" if intact else f"NOT the one it reported (round {last[0]}, {last[1]})"
            self.console.print(f"round {rnd}: client {cid} rejoined on node {node_id} with its model of round "
                               f"{committed} (digest {digest}): {state}")
        return None

    # ----------------------------------------------------------------- messages
    def _send(self, message_type: str, contents: dict[int, RecordDict],
              timeout: Optional[float] = None) -> dict[int, Any]:
        """One message per node; ``{node id: reply content or TaskFailure}`` (``timeout``: default ``reply_timeout_s``)."""
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
            if reply.has_error():
                out[src] = TaskFailure(f"Flower error {reply.error.code}: {reply.error.reason}")
            elif "error" in reply.content:
                error = reply.content["error"]
                out[src] = TaskFailure(str(error["reason"]), str(error["stage"]) if "stage" in error else None)
            else:
                out[src] = reply.content
        for node_id in nodes:
            if node_id not in out:
                out[node_id] = TaskFailure(f"node {node_id} sent no reply within {timeout or 0:g} s (stopped or "
                                           "unreachable)")
        return out

    def _exchange(self, rnd: int, stage: str, message_type: str,
                  requests: dict[int, tuple[dict[str, Any], dict[str, Any]]]) -> dict[int, Any]:
        """Send each listed client's request ``(config, arrays)`` to its node, with the training steps queued for it
        (:meth:`_client_train`); ``{client id: reply content or TaskFailure}``. The queued steps' losses are kept;
        bytes each way are recorded per client (``traffic.csv``); a client whose node did not reply loses its node
        (it is greeted again at the start of the next round, or replaced by a restarted node)."""
        start = time.perf_counter()
        out: dict[int, Any] = {}
        contents, by_node, carried = {}, {}, {}
        for cid, (config, tensors) in requests.items():
            steps = self._pending.pop(cid, [])
            if cid not in self.node_of:
                out[cid] = TaskFailure("no node holds this client (it left and has not rejoined)",
                                       stage_of(steps[0][0]) if steps else None)
                continue
            step_config, step_arrays = wire.steps_to_record(steps)
            content = RecordDict({"config": ConfigRecord({"round": rnd, **config, **step_config})})
            arrays = {**tensors, **step_arrays}
            records = {k: wire.tensors_to_record(v) for k, v in arrays.items() if isinstance(v, dict)}  # FedAvg
            flat = {k: v for k, v in arrays.items() if not isinstance(v, dict)}
            if flat:
                records["arrays"] = wire.tensors_to_record(flat)
            for name, record in records.items():
                content[name] = record
            node_id = self.node_of[cid]
            contents[node_id], by_node[node_id], carried[cid] = content, cid, (steps, records)
        for node_id, reply in self._send(message_type, contents).items():
            cid = by_node[node_id]
            steps, records = carried[cid]
            failed = isinstance(reply, TaskFailure)
            if failed and reply.step is None and steps and reply.reason.startswith(("node ", "Flower error")):
                reply = TaskFailure(reply.reason, stage_of(steps[0][0]))  # no reply: the first carried step is unfinished
            out[cid] = reply
            if not failed and steps:
                try:
                    self._keep_losses(rnd, cid, steps, reply["losses"])
                except (KeyError, TypeError, ValueError) as err:  # another version's reply: this client fails
                    reply = out[cid] = TaskFailure(f"rejected: malformed reply ({type(err).__name__}: {err})",
                                                   stage_of(steps[0][0]))
                    failed = True
            sent = [wire.array_bytes(r) for r in records.values()]
            received = [] if failed else [wire.array_bytes(reply[k]) for k in ("arrays",) if k in reply]
            self.traffic.append({
                "round": rnd, "client": cid, "message": message_type,
                "stages": "+".join([stage_of(st) for st, _ in steps] + [stage]),
                "sent_bytes": sum(b[0] for b in sent), "sent_serialized_bytes": sum(b[1] for b in sent),
                "received_bytes": sum(b[0] for b in received),
                "received_serialized_bytes": sum(b[1] for b in received), "ok": not failed})
            if failed and reply.reason.startswith(("node ", "Flower error")):
                self.node_of.pop(cid, None)
        if self.recorder.run_dir is not None:
            self.recorder.run_dir.write_text("traffic.csv", format_csv(self.traffic))
        self.timer.add(rnd, stage, time.perf_counter() - start)
        return out

    def _keep_losses(self, rnd: int, cid: int, steps: list, losses: Any) -> None:
        for j, (step, _) in enumerate(steps):
            prefix = f"s{j}."
            parts = {k[len(prefix):]: float(v) for k, v in losses.items() if k.startswith(prefix)}
            if parts:
                self._client_losses.setdefault(stage_of(step), {})[cid] = parts
        self._settle_losses(rnd)

    # ----------------------------------------------------------------- the transport
    def _client_train(self, rnd: int, stage: str, ids: list[int], step: Any,
                      targets: dict[int, Any]) -> dict[int, Any]:
        """Queue the step for each client: it travels with the client's next message, which replies its losses
        (or its failure, recorded then under this step's stage)."""
        for i in ids:
            self._pending.setdefault(i, []).append((step, None if isinstance(step, LocalFit) else targets[i]))
        return {i: [] for i in ids}

    def _client_uploads(self, rnd: int, kind: str, ids: list[int]) -> dict[int, Any]:
        if kind == "weights":
            out = {}
            for i, r in self._exchange(rnd, "weights", wire.WEIGHTS, {i: ({}, {}) for i in ids}).items():
                try:
                    out[i] = r if isinstance(r, TaskFailure) else wire.record_to_tensors(r["arrays"])
                except (KeyError, TypeError, ValueError) as err:
                    out[i] = TaskFailure(f"rejected: malformed upload ({type(err).__name__}: {err})", "upload")
            return out
        config = {"kind": kind, "dtype": self.comm.upload_dtype, "top_k": self.comm.top_k or 0,
                  "public_fingerprint": self.fingerprint}
        out: dict[int, Any] = {}
        for i, r in self._exchange(rnd, "pseudo-labels", wire.PSEUDO_LABELS, {i: (config, {}) for i in ids}).items():
            if isinstance(r, TaskFailure):
                out[i] = TaskFailure(r.reason, r.step or "pseudo-labels")
                continue
            try:
                out[i] = wire.record_to_payload(r["arrays"], dict(r["config"]))
            except (KeyError, TypeError, ValueError) as err:  # malformed: rejected like a bad upload
                out[i] = TaskFailure(f"rejected: malformed upload ({type(err).__name__}: {err})", "upload")
        return out

    def _client_load_weights(self, rnd: int, states: dict[int, Any]) -> dict[int, Any]:
        replies = self._exchange(rnd, "load weights", wire.LOAD_WEIGHTS,
                                 {i: ({}, {"weights": dict(s)}) for i, s in states.items()})
        return {i: r if isinstance(r, TaskFailure) else None for i, r in replies.items()}

    def _client_scores(self, rnd: int) -> dict[tuple[int, str], dict[str, dict[str, float]]]:
        """Each node runs its queued steps, scores its own f_i and commits its model; the server scores its own
        models for each client (COSMOS: the cluster teacher h_pi(i)) on the client's test split, which it rebuilt
        from the config.

        Raises:
            RoundFailed: with the failures of the queued steps, fewer than ``failures.min_fraction`` of the clients
                finished the round: the run stops there, as in-process (the nodes have already committed their
                models of this round, which a new run does not read).
        """
        replies = self._exchange(rnd, "evaluation", wire.SCORES,
                                 {c.id: ({"failed": c.id in self._failed}, {}) for c in self.clients})
        for cid, reply in list(replies.items()):
            info: dict[str, Any] = {}
            if not isinstance(reply, TaskFailure):
                try:
                    info = dict(reply["config"])
                    reply = replies[cid] = (unpack_scores(reply["metrics"]), str(info["digest"]))
                except (KeyError, TypeError, ValueError) as err:  # another version's reply
                    reply = replies[cid] = TaskFailure(f"rejected: malformed reply ({type(err).__name__}: {err})")
            if cid in self._failed:
                continue
            if isinstance(reply, TaskFailure):
                self._fail(rnd, cid, reply.step or "evaluation", reply.reason)
            elif "failed_step" in info:  # a queued step failed on the node: the client failed the round
                self._fail(rnd, cid, str(info["failed_step"]), str(info["failure"]))
        self._settle_losses(rnd)
        self._check_fraction(rnd)  # too many failed: the round is not committed, as in-process
        tasks, keys = [], []
        for c in self.clients:
            models = self.algorithm.eval_models(c.id)
            for split, task in self.steps.evaluate(c, rnd, models) if models else []:
                tasks.append(task)
                keys.append((c.id, split))
        server = {key: out for key, (_, out) in zip(keys, self.run_tasks(rnd, "evaluation", tasks))}
        nan = {"top1": float("nan"), **({"top5": float("nan")} if self.fed.num_classes >= 20 else {})}
        scores: dict[tuple[int, str], dict[str, dict[str, float]]] = {}
        for c in self.clients:
            reply = replies[c.id]
            own: dict[str, Any] = {}
            if not isinstance(reply, TaskFailure):
                own, digest = reply
                self.reported[c.id] = (rnd, digest)
            for split, _ in self.steps.evaluate(c, rnd, {}):
                scores[(c.id, split)] = {"client": own.get(split, {}).get("client", nan),
                                         **server.get((c.id, split), {})}
        return scores

    # ----------------------------------------------------------------- rounds
    def pretrain(self, cache: Any = None, key: str = "") -> None:
        """Wait for one node per client, then round 0 on the nodes (no round-0 cache: the models are theirs)."""
        self._join(0, wait=True)
        super().pretrain(None, key)

    def train_round(self, rnd: int) -> dict[str, int]:
        self._join(rnd, wait=False)  # nodes restarted since the last round rejoin here
        return super().train_round(rnd)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Raises ConfigError: a run over Flower is not resumed (its client models live on the nodes)."""
        raise ConfigError("--resume: a run over Flower cannot be resumed (the client models live on the nodes, which "
                          "start a new run from round 0); start a new run")

    def state_dict(self) -> dict[str, Any]:
        """The server's state only: the client models are on the nodes (each keeps its own checkpoint)."""
        state = super().state_dict()
        state["clients"] = []
        return state


"""The server side over Flower: the same runner, with client steps sent to nodes instead of the executor.

:class:`FlowerRunner` overrides only the runner's four transport methods (train, uploads, load weights, scores);
the round loop, upload checks, aggregation, teachers, records and checkpoints are :class:`Runner`'s. Each message
goes out with ``grid.send_and_receive``; an error reply or a missing reply (``reply_timeout_s``) fails that client
for the round with the reason, and the round goes on with the others (``failures``).

Nodes join by ``query.hello`` at the start of every round: a node the server has not seen (a new one, or one
restarted after a crash, which comes back under a new node id) says which client it holds, the round its model
was last committed and that model's digest; the server records whether the digest is the one the client reported
when it last committed (``nodes.json``). Every message's bytes are recorded per client and round (``traffic.csv``).
"""

from __future__ import annotations

import time
from typing import Any, Optional

from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict

from cosmos_pl.algorithms.base import LocalFit
from cosmos_pl.errors import UserError
from cosmos_pl.federated.executor import TaskFailure
from cosmos_pl.federated.recorder import format_csv
from cosmos_pl.federated.runner import Runner
from cosmos_pl.flower import wire
from cosmos_pl.flower.node import unpack_scores

__all__ = ["FlowerRunner", "NodesMissing"]


class NodesMissing(UserError):
    """Fewer nodes than clients joined before round 0 within ``join_timeout_s``."""


class FlowerRunner(Runner):
    """A :class:`Runner` whose clients live on Flower nodes.

    Args (besides :class:`Runner`'s):
        grid: the ServerApp's ``Grid``.
        config_yaml: the run's resolved config, sent to every node in ``query.hello``.
        reply_timeout_s: seconds to wait for the replies of one step (default ``failures.timeout_s``, else 600);
            a node that has not replied by then fails the step.
        join_timeout_s: seconds to wait before round 0 for one node per client.
    """

    def __init__(self, *args: Any, grid: Any, config_yaml: str, reply_timeout_s: Optional[float] = None,
                 join_timeout_s: float = 600.0, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.grid, self.config_yaml = grid, config_yaml
        self.reply_timeout_s = float(reply_timeout_s or self.failure_cfg.timeout_s or 600.0)
        self.join_timeout_s = join_timeout_s
        self.node_of: dict[int, int] = {}  # client id -> node id
        self.reported: dict[int, tuple[int, str]] = {}  # client id -> (round, digest) of its last commit
        self.traffic: list[dict[str, Any]] = []
        self.joins: list[dict[str, Any]] = []

    # ----------------------------------------------------------------- nodes
    def _join(self, rnd: int, wait: bool) -> None:
        """Greet every node the server has not seen yet; with ``wait``, until each client has a node."""
        deadline = time.monotonic() + (self.join_timeout_s if wait else 0.0)
        n = len(self.clients)
        refused: dict[int, str] = {}  # node id -> why it could not join (asked once per call)
        while True:
            present = set(self.grid.get_node_ids())
            for cid in [c for c, node in self.node_of.items() if node not in present]:
                del self.node_of[cid]  # its node left
            new = sorted(present - set(self.node_of.values()) - set(refused))
            if new:
                config = {"config_yaml": self.config_yaml, "public_fingerprint": self.fingerprint}
                for node_id, reply in self._send(new, wire.HELLO, config, None).items():
                    reason = self._greeted(rnd, node_id, reply)
                    if reason:
                        refused[node_id] = reason
            if not wait or len(self.node_of) == n:
                return
            if time.monotonic() > deadline or len(self.node_of) + len(refused) >= n:
                missing = sorted(set(range(n)) - set(self.node_of))
                why = f"; a node could not join: {next(iter(refused.values()))}" if refused else ""
                raise NodesMissing(f"only {len(self.node_of)} of {n} clients joined within {self.join_timeout_s:g} s "
                                   f"(missing: {missing}); start one SuperNode per client with --node-config "
                                   f"'partition-id=<client>' against this SuperLink{why}")
            time.sleep(1.0)

    def _greeted(self, rnd: int, node_id: int, reply: Any) -> Optional[str]:
        """Record a node's hello reply; returns why it could not join, or None."""
        if isinstance(reply, TaskFailure):
            self.console.print(f"round {rnd}: node {node_id} could not join: {reply.reason}")
            return reply.reason
        info = reply["config"]
        cid = int(info["client_id"])
        if cid in self.node_of:
            reason = f"node {node_id} says it holds client {cid}, which node {self.node_of[cid]} already holds"
            self.console.print(f"round {rnd}: {reason}; ignoring it (give each node its own partition-id)")
            return reason
        self.node_of[cid] = node_id
        committed, digest = int(info["committed_round"]), str(info["digest"])
        last = self.reported.get(cid)
        intact = None if last is None else last == (committed, digest)
        self.joins.append({"round": rnd, "client": cid, "node_id": node_id, "committed_round": committed,
                           "digest": digest, "last_reported": None if last is None else list(last), "intact": intact})
        self.recorder.write_json("nodes.json", {"clients": {str(c): n for c, n in sorted(self.node_of.items())},
                                                "joins": self.joins})
        if last is not None:
            state = "intact" if intact else f"NOT the one it reported (round {last[0]}, {last[1]})"
            self.console.print(f"round {rnd}: client {cid} rejoined on node {node_id} with its model of round "
                               f"{committed} (digest {digest}): {state}")
        return None

    # ----------------------------------------------------------------- messages
    def _send(self, nodes: list[int], message_type: str, config: dict[str, Any],
              arrays: Optional[dict[int, ArrayRecord]]) -> dict[int, Any]:
        """One message per node; ``{node id: reply content or TaskFailure}``."""
        messages = []
        for node_id in nodes:
            content = RecordDict({"config": ConfigRecord(dict(config))})
            if arrays is not None and node_id in arrays:
                content["arrays"] = arrays[node_id]
            messages.append(Message(content, dst_node_id=node_id, message_type=message_type))
        out: dict[int, Any] = {}
        for reply in self.grid.send_and_receive(messages, timeout=self.reply_timeout_s):
            src = reply.metadata.src_node_id
            if reply.has_error():
                out[src] = TaskFailure(f"Flower error {reply.error.code}: {reply.error.reason}")
            elif "error" in reply.content:
                out[src] = TaskFailure(str(reply.content["error"]["reason"]))
            else:
                out[src] = reply.content
        for node_id in nodes:
            if node_id not in out:
                out[node_id] = TaskFailure(f"node {node_id} sent no reply within {self.reply_timeout_s:g} s "
                                           "(stopped or unreachable)")
        return out

    def _exchange(self, rnd: int, stage: str, message_type: str, config: dict[str, Any], ids: list[int],
                  arrays: Optional[dict[int, ArrayRecord]] = None) -> dict[int, Any]:
        """Send one step to the listed clients' nodes; ``{client id: reply content or TaskFailure}``. Bytes each
        way are recorded per client (``traffic.csv``); a client whose node did not reply loses its node (it
        rejoins at the start of a later round)."""
        start = time.perf_counter()
        out: dict[int, Any] = {i: TaskFailure("no node holds this client (it left and has not rejoined)")
                               for i in ids if i not in self.node_of}
        present = [i for i in ids if i in self.node_of]
        by_node = {self.node_of[i]: i for i in present}
        node_arrays = None if arrays is None else {self.node_of[i]: a for i, a in arrays.items() if i in present}
        replies = self._send(list(by_node), message_type, {"round": rnd, **config}, node_arrays)
        for node_id, reply in replies.items():
            cid = by_node[node_id]
            out[cid] = reply
            sent = wire.array_bytes(None if arrays is None else arrays.get(cid))
            received = (0, 0) if isinstance(reply, TaskFailure) else wire.array_bytes(reply.get("arrays"))
            self.traffic.append({"round": rnd, "client": cid, "message": message_type, "stage": stage,
                                 "sent_bytes": sent[0], "sent_serialized_bytes": sent[1],
                                 "received_bytes": received[0], "received_serialized_bytes": received[1],
                                 "ok": not isinstance(reply, TaskFailure)})
            if isinstance(reply, TaskFailure) and reply.reason.startswith(("node ", "Flower error")):
                self.node_of.pop(cid, None)
        if self.recorder.run_dir is not None:
            self.recorder.run_dir.write_text("traffic.csv", format_csv(self.traffic))
        self.timer.add(rnd, stage, time.perf_counter() - start)
        return out

    # ----------------------------------------------------------------- the transport
    def _client_train(self, rnd: int, stage: str, ids: list[int], step: Any,
                      targets: dict[int, Any]) -> dict[int, Any]:
        arrays = None if isinstance(step, LocalFit) else \
            {i: wire.tensors_to_record({"target": targets[i].float()}) for i in ids}
        replies = self._exchange(rnd, stage, wire.STEP, wire.step_to_config(step), ids, arrays)
        return {i: r if isinstance(r, TaskFailure) else ([dict(r["metrics"])] if len(r["metrics"]) else [])
                for i, r in replies.items()}

    def _client_uploads(self, rnd: int, kind: str, ids: list[int]) -> dict[int, Any]:
        if kind == "weights":
            replies = self._exchange(rnd, "weights", wire.WEIGHTS, {}, ids)
            return {i: r if isinstance(r, TaskFailure) else wire.record_to_tensors(r["arrays"])
                    for i, r in replies.items()}
        config = {"kind": kind, "dtype": self.comm.upload_dtype, "top_k": self.comm.top_k or 0,
                  "public_fingerprint": self.fingerprint}
        out: dict[int, Any] = {}
        for i, r in self._exchange(rnd, "pseudo-labels", wire.PSEUDO_LABELS, config, ids).items():
            if isinstance(r, TaskFailure):
                out[i] = TaskFailure(r.reason, "pseudo-labels")
                continue
            try:
                out[i] = wire.record_to_payload(r["arrays"], dict(r["config"]))
            except (KeyError, TypeError, ValueError) as err:  # malformed: rejected like a bad upload
                out[i] = TaskFailure(f"rejected: malformed upload ({type(err).__name__}: {err})", "upload")
        return out

    def _client_load_weights(self, rnd: int, states: dict[int, Any]) -> dict[int, Any]:
        arrays = {i: wire.tensors_to_record(s) for i, s in states.items()}
        replies = self._exchange(rnd, "load weights", wire.LOAD_WEIGHTS, {}, list(states), arrays)
        return {i: r if isinstance(r, TaskFailure) else None for i, r in replies.items()}

    def _client_scores(self, rnd: int) -> dict[tuple[int, str], dict[str, dict[str, float]]]:
        """Each node scores its own f_i (and commits its model); the server scores its own models for each
        client (COSMOS: the cluster teacher h_pi(i)) on the client's test split, which it rebuilt from the config."""
        ids = [c.id for c in self.clients]
        replies = {}
        for failed in (False, True):  # the config is per message: one exchange for each value of "failed"
            group = [i for i in ids if (i in self._failed) == failed]
            if group:
                replies.update(self._exchange(rnd, "evaluation", wire.SCORES, {"failed": failed}, group))
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
            if isinstance(reply, TaskFailure):
                if c.id not in self._failed:
                    self._fail(rnd, c.id, "evaluation", reply.reason)
                own: dict[str, Any] = {}
            else:
                own = unpack_scores(reply["metrics"])
                self.reported[c.id] = (rnd, str(reply["config"]["digest"]))
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

    def state_dict(self) -> dict[str, Any]:
        """The server's state only: the client models are on the nodes (each keeps its own checkpoint)."""
        state = super().state_dict()
        state["clients"] = []
        return state


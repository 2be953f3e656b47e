"""How nodes join a deployment's run: ``query.hello`` to every new node (before round 0, then at the start of every
round), U sent to a site that lacks it, and ``nodes.json``: the run's mode, how clients are bound to nodes (``key``:
the operator's ``sites`` file; ``token``: the node's own token, first come first served), which node holds which
client, every join and whether the model digest it reports is the one its client last committed, and every refusal
with its reason.

Every hello reply is checked (:func:`cosmos_pl.flower.validate.hello`) before anything in it is kept; a malformed
or refused one fails only that node's join.

:class:`NodeJoining` is a part of :class:`~cosmos_pl.flower.server.FlowerClients` (its node bookkeeping), apart from
the messages of the rounds.
"""

from __future__ import annotations

import time
from typing import Any, Optional

from flwr.app import ConfigRecord, RecordDict

from cosmos_pl.federated.clients import ClientInfo
from cosmos_pl.execution.task_failure import TaskFailure
from cosmos_pl.flower import validate, wire
from cosmos_pl.flower.replies import NodesMissing, NoReply, SiteFailure

__all__ = ["NodeJoining"]


class NodeJoining:
    """The node bookkeeping of :class:`~cosmos_pl.flower.server.FlowerClients`, which sets the attributes it reads
    (the view, the clients' count ``n``, the run's ``mode``, the config and run token sent in the hello, what a hello
    must say (``expected``), the operator's ``site_keys`` or None, the console and recorder, the maps of nodes,
    ``extra_bytes`` and ``needs_public``) and provides :meth:`~cosmos_pl.flower.server.FlowerClients.send`
    (one message per node); :meth:`join` is what the server calls."""

    def join(self, rnd: int, wait: bool, refused: Optional[dict[int, str]] = None) -> None:
        """Greet every node the server has not seen yet; with ``wait``, until each client has a node. A node in
        ``refused`` (node id -> reason, filled here) is not asked again.

        With ``wait`` it stops waiting at ``join_timeout_s``, or earlier once at least as many nodes as clients are
        connected and every one of them has answered, some refusing (a wrong ``partition-id``, an unknown node config
        key, a client held twice): a misconfigured node fails the run in the time a hello takes, not the whole
        join timeout.

        Raises:
            NodesMissing: with ``wait``, a client has no node when it stops waiting; says which clients are missing,
                how long it waited and why it stopped, and the first refusal's reason.
        """
        start = said = time.monotonic()
        deadline = start + (self.join_timeout_s if wait else 0.0)
        refused = {} if refused is None else refused  # node id -> why it could not join (asked once per call)
        while True:
            nodes = self._nodes()
            present = set(nodes)
            for cid in [c for c, node in self.node_of.items() if node not in present]:
                del self.node_of[cid]  # its node left
            new = sorted(present - set(self.node_of.values()) - set(refused))  # online nodes only (Flower)
            if new:
                config = {"mode": self.mode, "config_yaml": self.config_yaml,
                          "public_fingerprint": self.view.fingerprint,
                          "run_token": self.run_token, "classes": list(self.view.data.classes),
                          "public_shape": [int(v) for v in self.view.public.shape]}
                hello = RecordDict({"config": ConfigRecord(config)})
                # a node's first message starts its ClientApp (imports, data): before round 0 it may take the whole
                # join timeout; later (a restarted node) the reply timeout
                timeout = max(1.0, deadline - time.monotonic()) if wait else self.reply_timeout_s
                for node_id, reply in self.send(wire.HELLO, {node: hello for node in new}, timeout).items():
                    reason = self._greeted(rnd, node_id, reply, nodes.get(node_id))
                    if reason and not isinstance(reply, NoReply):  # a refusal; a node that did not reply is asked again
                        refused[node_id] = reason
                        self.join_failures.append({"round": rnd, "node_id": node_id, "reason": reason})
                        self._write_nodes()
            self._send_public(rnd)
            if not wait or len(self.node_of) == self.n:
                return
            now = time.monotonic()
            waited = now - start
            answered = len(present) >= self.n and len(self.node_of) + len(refused) >= len(present)
            if answered or now >= deadline:
                missing = sorted(set(range(self.n)) - set(self.node_of))
                if answered:
                    why = (f"all {len(present)} connected nodes answered within {waited:.1f} s and {len(refused)} "
                           f"refused, so the server stopped waiting before join-timeout={self.join_timeout_s:g} s")
                else:
                    why = (f"waited the whole join-timeout={self.join_timeout_s:g} s ({waited:.1f} s) with "
                           f"{len(present)} node{'s' if len(present) != 1 else ''} connected")
                if refused:  # the nodes are there: what to fix is why they were refused
                    first = next(iter(refused.items()))
                    more = f" ({len(refused) - 1} more in nodes.json)" if len(refused) > 1 else ""
                    advice = f"node {first[0]} could not join: {first[1]}{more}"
                else:
                    advice = ("start one SuperNode per client with --node-config 'partition-id=<client>' against "
                              "this SuperLink")
                raise NodesMissing(f"only {len(self.node_of)} of {self.n} clients joined (missing: {missing}): {why}; "
                                   f"{advice}")
            if now - said >= 30:  # a long wait says what it waits for, not silence
                said = now
                self.console.print(f"round {rnd}: waiting for the nodes of clients "
                                   f"{sorted(set(range(self.n)) - set(self.node_of))} ({len(self.node_of)} of "
                                   f"{self.n} joined, {len(present)} connected, {len(refused)} refused; "
                                   f"{waited:.0f} s of join-timeout={self.join_timeout_s:g} s)")
            time.sleep(max(0.0, min(1.0, deadline - time.monotonic())))

    def _send_public(self, rnd: int, chunk_bytes: int = 4 << 20) -> None:
        """Send U, in chunks of about ``chunk_bytes``, to the sites that do not have it; they keep it by its
        fingerprint. Counted as each such client's setup bytes. A site that fails to take it is asked again when
        it next joins (its client fails the round's steps meanwhile)."""
        todo = sorted(c for c in self.needs_public if c in self.node_of and c not in self.broken)
        if not todo:
            return
        public = self.view.public
        rows = max(1, chunk_bytes // max(1, public[0].numel() * public.element_size()))
        for start in range(0, len(public), rows):
            record = wire.tensors_to_record({"x": public[start:start + rows]})  # "x": the wire's key for the images
            config = {"public_fingerprint": self.view.fingerprint, "start": start, "rows": len(public)}
            content = {self.node_of[c]: RecordDict({"config": ConfigRecord(config), "arrays": record}) for c in todo}
            sent = wire.array_bytes(record)[0]
            for node_id, reply in self.send(wire.PUBLIC, content).items():
                cid = next(c for c in todo if self.node_of[c] == node_id)
                self.extra_bytes["setup"][cid] = self.extra_bytes["setup"].get(cid, 0) + sent
                if isinstance(reply, TaskFailure):
                    self.console.print(f"round {rnd}: client {cid} could not take U: {reply.reason}")
                    todo.remove(cid)
                    self.node_of.pop(cid, None)  # greeted again, and sent U again, when it rejoins
        self.needs_public -= set(todo)

    def _write_nodes(self) -> None:
        self.recorder.write_json("nodes.json", {
            "mode": self.mode, "bound_by": "sites" if self.site_keys is not None else "token",
            "clients": {str(c): n for c, n in sorted(self.node_of.items())}, "joins": self.joins,
            "join_failures": self.join_failures})

    def _greeted(self, rnd: int, node_id: int, reply: Any, public_key: Optional[bytes] = None) -> Optional[str]:
        """Record a node's hello reply; returns why it could not join, or None.

        Every branch is checked before anything is kept: the reply (:func:`cosmos_pl.flower.validate.hello`), then
        whether this node may hold the client it claims (:meth:`_holder_refusal`: the key the operator named for it,
        or without ``sites`` the token of the node that first held it), then whether another node holds it. A site
        whose own data cannot be used (a :class:`SiteFailure` reply) holds its client all the same once it passes
        those checks: that client fails every round with the reason (the run goes on)."""
        try:
            if isinstance(reply, SiteFailure):
                cid, identity, hello = reply.client, reply.identity, None
            elif isinstance(reply, TaskFailure):
                self.console.print(f"round {rnd}: node {node_id} could not join: {reply.reason}")
                return reply.reason
            else:
                hello = validate.hello(reply, self.expected)
                cid, identity = hello.info.id, hello.identity
        except Exception as err:  # noqa: BLE001 - whatever a node sends, it fails only its own join
            reason = f"hello from node {node_id} not accepted: {validate.described(err)}"
            self.console.print(f"round {rnd}: {reason}; refused")
            return reason
        refusal = self._holder_refusal(cid, node_id, identity, public_key)
        if refusal is None and cid in self.node_of:
            refusal = (f"client {cid} is already held by node {self.node_of[cid]}, and node {node_id} says it holds "
                       "it too (give each node its own partition-id)")
        if refusal is not None:
            self.console.print(f"round {rnd}: node {node_id} refused: {refusal}")
            return refusal
        self.identity_of.setdefault(cid, identity)
        if hello is None:
            self.node_of[cid], self.broken[cid] = node_id, reply.reason
            self.described[cid] = ClientInfo(cid, self.expected.backbones(cid), 0, 0, 0, 0)
            self.console.print(f"round {rnd}: client {cid} (node {node_id}) cannot use its data: {reply.reason}")
            self._write_nodes()
            return None
        self.node_of[cid] = node_id
        self.broken.pop(cid, None)
        if not hello.has_public:
            self.needs_public.add(cid)
        self.described[cid] = hello.info
        self.extra_bytes["setup"][cid] = self.extra_bytes["setup"].get(cid, 0) + len(self.config_yaml.encode())
        committed, digest = hello.committed_round, hello.digest
        last = self.reported.get(cid)
        intact = None if last is None else last == (committed, digest)
        self.joins.append({"round": rnd, "client": cid, "node_id": node_id, "committed_round": committed,
                           "digest": digest, "last_reported": None if last is None else list(last), "intact": intact,
                           "bound_by": self._bound_by(cid)})
        self._write_nodes()
        if last is not None:
            state = "intact" if intact else f"NOT the one it reported (round {last[0]}, {last[1]})"
            self.console.print(f"round {rnd}: client {cid} rejoined on node {node_id} with its model of round "
                               f"{committed} (digest {digest}): {state}")
        return None

    def _holder_refusal(self, cid: int, node_id: int, identity: str, public_key: Optional[bytes]) -> Optional[str]:
        """Why ``node_id`` may not hold ``cid``: with ``sites``, its key is not the one named for the client
        (:meth:`~cosmos_pl.flower.bindings.SiteKeys.refusal`); without, another token held the client first."""
        if self.site_keys is not None:
            return self.site_keys.refusal(cid, node_id, public_key)
        first = self.identity_of.get(cid, identity)
        if first == identity:
            return None
        return (f"client {cid} was first held by another node (identity {first[:8]}...), and node {node_id} (identity "
                f"{identity[:8]}...) claims it: a client id stays with the node that held it (restart that node on "
                "its own state-dir, or give this one its own partition-id)")

    def _bound_by(self, cid: int) -> str:
        """How the holder of ``cid`` was checked: ``key`` or ``node id`` (named in ``sites``), else ``token``."""
        if self.site_keys is None:
            return "token"
        return "node id" if isinstance(self.site_keys.holders.get(cid), int) else "key"

    def _nodes(self) -> dict[int, Optional[bytes]]:
        """The connected nodes: node id -> the public key the SuperLink registered for it (PEM; read only when
        ``sites`` binds clients to keys)."""
        if self.site_keys is None:
            return {int(n): None for n in self.grid.get_node_ids()}
        return {int(info.node_id): bytes(info.public_key) for info in self.grid.get_nodes()}

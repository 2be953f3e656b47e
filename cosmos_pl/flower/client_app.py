"""The Flower ``ClientApp``: each message runs the client steps it carries (:mod:`cosmos_pl.flower.node`) on this node.

A step that raises replies ``{"error": {"type", "reason"}}`` instead of content, so the server records the client's
failure for that round with the reason and goes on with the others (``failures.on_error: skip``).

Node config (``flower-supernode --node-config``): ``partition-id`` (which client of the federation this node is,
0..N-1; required), ``state-dir`` (where the committed model is kept; default ``~/.cache/cosmos-pl/flower``),
``threads`` (torch CPU threads; default ``executor.threads_per_worker`` of the run, else every core). Any other key
(a misspelt ``partiton-id``) makes the node refuse to join, naming the key and the close match; the server records
the refusal as that node's join failure (``nodes.json``).
"""

from __future__ import annotations

from typing import Callable

from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

from cosmos_pl.flower import node

__all__ = ["app"]

app = ClientApp()


def _reply(message: Message, context: Context, handler: Callable[[RecordDict, Context], RecordDict]) -> Message:
    try:
        content = handler(message.content, context)
    except node.StepFailed as err:  # a carried training step: named, so the server records the right stage
        content = RecordDict({"error": ConfigRecord({"type": "StepFailed", "reason": str(err), "stage": err.stage})})
    except Exception as err:  # the client's failure, reported with its reason; the node keeps serving
        reason = " ".join(f"{type(err).__name__}: {err}".split())[:1000]
        content = RecordDict({"error": ConfigRecord({"type": type(err).__name__, "reason": reason})})
    return Message(content, reply_to=message)


@app.query("hello")
def _hello(message: Message, context: Context) -> Message:
    return _reply(message, context, node.hello)


@app.query("pseudo_labels")
def _pseudo_labels(message: Message, context: Context) -> Message:
    return _reply(message, context, node.pseudo_labels)


@app.query("weights")
def _weights(message: Message, context: Context) -> Message:
    return _reply(message, context, node.weights)


@app.train("load_weights")
def _load_weights(message: Message, context: Context) -> Message:
    return _reply(message, context, node.load_weights)


@app.evaluate("scores")
def _scores(message: Message, context: Context) -> Message:
    return _reply(message, context, node.scores)

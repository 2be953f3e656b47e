"""The Flower ``ClientApp``: each message runs the client steps it carries (:mod:`cosmos_pl.flower.node`) on this node.

A step that raises replies ``{"error": {"type", "reason"}}`` instead of content, so the server records the client's
failure for that round with the reason and goes on with the others (``failures.on_error: skip``).

Node config (``flower-supernode --node-config``): ``partition-id`` (which client of the federation this node is,
0..N-1; required), ``data`` (the site's own data: a folder ``cosmos-pl export-partition`` wrote, or an ImageFolder
tree; required in a deployment, where a node without it, or with a folder that is not there or not readable,
refuses to join; in a simulation without it the node takes its partition of the data set the run config names),
``state-dir`` (where the committed model, U, the data cache and the node's identity are kept; default
``~/.cache/cosmos-pl/flower``), ``threads`` (torch CPU threads; default ``executor.threads_per_worker`` of the run,
else every core). Any other key (a misspelt ``partiton-id``) makes the node refuse to join, naming the key and the
close match; the server records the refusal as that node's join failure (``nodes.json``).
"""

from __future__ import annotations

import sys
from typing import Callable

from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

from cosmos_pl.flower import node
from cosmos_pl.flower.node_state import identity

__all__ = ["app", "respond", "HANDLERS"]

app = ClientApp()


def respond(handler: Callable[[RecordDict, Context], RecordDict], content: RecordDict, context: Context) -> RecordDict:
    """``handler``'s reply to ``content``, or the error record the server reads as the client's failure: the
    reason, and the stage (a carried step) or the client (a site whose data cannot be used) it concerns. The error's
    reason is also printed on stderr (``cosmos-pl node: <handler>: <reason>``), which the SuperNode's own log shows:
    a site sees why it refused to join, not only the server."""
    reply = _respond(handler, content, context)
    if "error" in reply:
        print(f"cosmos-pl node: {handler.__name__}: {reply['error']['reason']}", file=sys.stderr, flush=True)
    return reply


def _respond(handler: Callable[[RecordDict, Context], RecordDict], content: RecordDict,
             context: Context) -> RecordDict:
    try:
        return handler(content, context)
    except node.NotSetUp as err:  # a restarted node under its old id: the server greets it again
        return RecordDict({"error": ConfigRecord({"type": "NotSetUp", "reason": f"NotSetUp: {err}"})})
    except node.StepFailed as err:  # a carried training step: named, so the server records the right stage
        return RecordDict({"error": ConfigRecord({"type": "StepFailed", "reason": str(err), "stage": err.stage})})
    except node.SiteDataError as err:  # this site's data cannot be used: its client fails, the run goes on
        return RecordDict({"error": ConfigRecord({"type": "SiteDataError", "reason": str(err)[:1000],
                                                  "client_id": err.client_id, "identity": identity(context)})})
    except Exception as err:  # the client's failure, reported with its reason; the node keeps serving
        reason = " ".join(f"{type(err).__name__}: {err}".split())[:1000]
        return RecordDict({"error": ConfigRecord({"type": type(err).__name__, "reason": reason})})


HANDLERS = {"query.hello": node.hello, "query.public": node.public, "query.pseudo_labels": node.pseudo_labels,
            "query.weights": node.weights, "train.load_weights": node.load_weights, "evaluate.scores": node.scores}


def _reply(message: Message, context: Context, handler: Callable[[RecordDict, Context], RecordDict]) -> Message:
    return Message(respond(handler, message.content, context), reply_to=message)


@app.query("hello")
def _hello(message: Message, context: Context) -> Message:
    return _reply(message, context, node.hello)


@app.query("public")
def _public(message: Message, context: Context) -> Message:
    return _reply(message, context, node.public)


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

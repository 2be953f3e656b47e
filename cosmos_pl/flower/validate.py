"""The one validator of what a node sends the server: every reply's records, types, ranges, shapes and sizes are
checked here, before anything in it is decoded or used.

A node is not trusted: its reply may come from another version, a bug or an attacker. Each function takes one reply
(the ``RecordDict`` Flower delivered) and returns what the server may use, or raises :class:`MalformedReply` naming
the first field that is wrong; the server (:mod:`cosmos_pl.flower.server`, :mod:`cosmos_pl.flower.joining`) turns
that into a refused join or the client's failure for the round, records it, and goes on with the others.

What the replies hold is listed in :mod:`cosmos_pl.flower.wire`; the checks:

- types: an integer field is an ``int`` (not a bool, not a float), a text field a ``str`` of bounded length, a flag a
  ``bool``; each record of the kind Flower's Message API gives it (``ConfigRecord``, ``MetricRecord``,
  ``ArrayRecord``);
- ranges: a client id in ``0..N-1``, a committed round in ``-1..R``, sizes in ``0..MAX_SAMPLES`` (training: at
  least 1, so that FedAvg's weights are defined), a parameter count in ``0..MAX_PARAMETERS``; scores in ``[0, 1]``
  or NaN (an empty split); losses any float;
- what the server itself knows: the architecture a client reports is the one the run config gives it, U's
  fingerprint is the server's, the node's data mode is the run's (``site`` in a deployment, ``partition`` in a
  simulation), an upload declares the run's M and dtype;
- arrays: names, declared shapes and dtypes and serialized sizes (:func:`cosmos_pl.flower.wire.check_declared`).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Iterable, Optional

from flwr.app import ArrayRecord, ConfigRecord, MetricRecord

from cosmos_pl.federated.clients import ClientInfo
from cosmos_pl.flower.wire import HEX

__all__ = ["HEX", "MAX_PARAMETERS", "MAX_SAMPLES", "MAX_TEXT", "Hello", "HelloExpected", "MalformedReply", "described",
           "error_reply", "hello", "losses", "record", "rejection", "scores", "upload_config"]

MAX_SAMPLES = 2**31 - 1  # a split's size: more than any data set a site holds, small enough to sum safely
MAX_PARAMETERS = 10**11  # a model's parameter count
MAX_TEXT = 1000  # characters of a reason, a stage or a name
_SPLITS = ("test", "validation")


class MalformedReply(ValueError):
    """A node's reply that the server does not use: the message names the field and what is wrong with it."""


def described(err: BaseException) -> str:
    """``err`` on one line of at most 300 characters (its type named, unless it is a :class:`MalformedReply`)."""
    text = str(err) if isinstance(err, MalformedReply) else f"{type(err).__name__}: {err}"
    return " ".join(text.split())[:300]


def rejection(err: BaseException, what: str = "reply") -> str:
    """The reason a node's reply is not used: ``rejected: malformed <what> (<err on one line>)``."""
    return f"rejected: malformed {what} ({described(err)})"


def record(content: Any, name: str, kind: type) -> Any:
    """``content[name]``, which must be a record of type ``kind``.

    Raises:
        MalformedReply: ``content`` is not a record dict, or lacks ``name``, or holds another kind of record.
    """
    try:
        got = content[name]
    except (KeyError, TypeError, IndexError):
        raise MalformedReply(f"no {kind.__name__} {name!r} in the reply") from None
    if not isinstance(got, kind):
        raise MalformedReply(f"{name!r} is a {type(got).__name__}, not a {kind.__name__}")
    return got


def _get(rec: Any, key: str) -> Any:
    if key not in rec:
        raise MalformedReply(f"field {key!r} is missing")
    return rec[key]


def _int(rec: Any, key: str, lo: int, hi: int) -> int:
    value = _get(rec, key)
    if isinstance(value, bool) or not isinstance(value, int):
        raise MalformedReply(f"field {key!r} is {_show(value)}, not an integer")
    if not lo <= value <= hi:
        raise MalformedReply(f"field {key!r} is {value}, outside {lo}..{hi}")
    return value


def _text(rec: Any, key: str, pattern: Optional[re.Pattern] = None, max_len: int = MAX_TEXT) -> str:
    value = _get(rec, key)
    if not isinstance(value, str):
        raise MalformedReply(f"field {key!r} is {_show(value)}, not text")
    if len(value) > max_len or (pattern is not None and not pattern.fullmatch(value)):
        raise MalformedReply(f"field {key!r} is {_show(value)}: not "
                             + ("lowercase hex of 1 to 64 digits" if pattern is HEX else f"text of at most {max_len} "
                                "characters"))
    return value


def _bool(rec: Any, key: str) -> bool:
    value = _get(rec, key)
    if not isinstance(value, bool):
        raise MalformedReply(f"field {key!r} is {_show(value)}, not true/false")
    return value


def _show(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:40]}{'...' if len(text) > 40 else ''}"


@dataclass(frozen=True)
class HelloExpected:
    """What the server knows of a hello before it arrives.

    Attributes:
        num_clients: N.
        rounds: R, the run's last round (a committed round is ``-1..R``).
        fingerprint: U's fingerprint.
        backbones: client id -> the architecture the run config gives it.
        data_mode: ``"site"`` (a deployment: each node serves its own folder) or ``"partition"`` (a simulation).
    """

    num_clients: int
    rounds: int
    fingerprint: str
    backbones: Any  # a callable: client id -> architecture name
    data_mode: str


@dataclass(frozen=True)
class Hello:
    """A checked hello reply: the client's description, its last commit, the node's token and whether it has U."""

    info: ClientInfo
    committed_round: int
    digest: str
    identity: str
    has_public: bool


def hello(content: Any, expected: HelloExpected) -> Hello:
    """Check a ``query.hello`` reply.

    Raises:
        MalformedReply: a field missing, of the wrong type or out of range; another architecture than the run's for
            that client, another U, or another data mode than the run's.
    """
    cfg = record(content, "config", ConfigRecord)
    cid = _int(cfg, "client_id", 0, expected.num_clients - 1)
    mode = _text(cfg, "data_mode", max_len=16)
    if mode != expected.data_mode:
        raise MalformedReply(f"the node serves {'its own folder' if mode == 'site' else mode!r} (data_mode "
                             f"{mode!r}), and this run wants data_mode {expected.data_mode!r}: "
                             + ("give each SuperNode data=<its folder> in a deployment" if expected.data_mode == "site"
                                else "in a simulation the nodes take their partition of the configured data set"))
    backbone = _text(cfg, "backbone", max_len=200)
    if backbone != expected.backbones(cid):
        raise MalformedReply(f"client {cid} says its architecture is {backbone!r}; the run config gives it "
                             f"{expected.backbones(cid)!r}")
    fingerprint = _text(cfg, "public_fingerprint", HEX)
    if fingerprint != expected.fingerprint:
        raise MalformedReply(f"the node's U has fingerprint {fingerprint}, the server's {expected.fingerprint}")
    info = ClientInfo(cid, backbone, _int(cfg, "train_size", 1, MAX_SAMPLES), _int(cfg, "test_size", 0, MAX_SAMPLES),
                      _int(cfg, "validation_size", 0, MAX_SAMPLES), _int(cfg, "parameters", 0, MAX_PARAMETERS))
    return Hello(info, _int(cfg, "committed_round", -1, expected.rounds), _text(cfg, "digest", HEX),
                 _text(cfg, "identity", HEX), _bool(cfg, "has_public"))


def error_reply(error: Any, num_clients: Optional[int] = None) -> tuple[str, Optional[str], Optional[int], str]:
    """A node's error record as ``(reason, stage or None, client id or None, type)``; a field of the wrong kind is
    dropped or shown as its repr (an error is a failure either way: it is not refused, it is recorded).

    ``client id`` is kept only when it is an integer in ``0..N-1`` (``num_clients``; any integer when None)."""
    def text(key: str) -> Optional[str]:
        value = error.get(key) if hasattr(error, "get") else None
        return None if value is None else (value if isinstance(value, str) else repr(value))[:MAX_TEXT]

    cid = error.get("client_id") if hasattr(error, "get") else None
    if isinstance(cid, bool) or not isinstance(cid, int) or (num_clients is not None and not 0 <= cid < num_clients):
        cid = None
    return text("reason") or "the node sent an error with no reason", text("stage"), cid, text("type") or ""


def losses(content: Any, steps: int) -> list[dict[str, float]]:
    """The losses of the ``steps`` training steps a message carried, from the reply's ``losses`` record
    (``{"s<j>.<name>": value}``), as one dict per step (empty for a step that logged none).

    Raises:
        MalformedReply: no ``losses`` MetricRecord, a key not ``s<j>.<name>`` for a carried step, a value not a
            number.
    """
    rec = record(content, "losses", MetricRecord)
    out: list[dict[str, float]] = [{} for _ in range(steps)]
    for key, value in rec.items():
        head, _, name = str(key).partition(".")
        if not (head[:1] == "s" and head[1:].isdigit() and int(head[1:]) < steps and name and len(key) <= 200):
            raise MalformedReply(f"losses key {key[:60]!r}: expected s<j>.<name> for one of the {steps} steps sent")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise MalformedReply(f"loss {key!r} is {_show(value)}, not a number")
        out[int(head[1:])][name] = float(value)
    return out


def upload_config(content: Any, num_classes: int, dtype: str) -> dict[str, Any]:
    """The config of a pseudo-label upload (M, dtype, U's fingerprint), checked against the run's M and dtype; the
    arrays are checked by :func:`cosmos_pl.flower.wire.check_declared`, the values by
    :func:`cosmos_pl.uploads.check_upload`.

    Raises:
        MalformedReply: a field missing or of the wrong type, another M or dtype.
    """
    cfg = record(content, "config", ConfigRecord)
    m = _int(cfg, "num_classes", 1, 10**7)
    declared = _text(cfg, "dtype", max_len=32)
    if (m, declared) != (num_classes, dtype):
        raise MalformedReply(f"the upload declares M = {m}, dtype {declared}; the run asked for M = {num_classes}, "
                             f"dtype {dtype}")
    fingerprint = _get(cfg, "public_fingerprint")
    if not isinstance(fingerprint, str) or len(fingerprint) > 64:
        raise MalformedReply(f"field 'public_fingerprint' is {_show(fingerprint)}, not a fingerprint")
    record(content, "arrays", ArrayRecord)
    return {"num_classes": m, "dtype": declared, "public_fingerprint": fingerprint}


def scores(content: Any, models: Iterable[str]) -> tuple[dict[str, dict[str, dict[str, float]]], str,
                                                         Optional[tuple[str, str]]]:
    """A ``evaluate.scores`` reply as ``(per split, digest, (failed step, reason) or None)``; ``models`` are the
    names it may score besides ``client`` (those the server sent; a sent ``teacher`` is also scored as
    ``teacher_prior``, :func:`~cosmos_pl.training.inference.evaluate_models`).

    Raises:
        MalformedReply: a metric key not ``<split>.<model>.<metric>`` of a known split and model, a score not a
            number in [0, 1] (NaN: an empty split), no digest.
    """
    known = {"client", *models}
    if "teacher" in known:
        known.add("teacher_prior")
    per_split: dict[str, dict[str, dict[str, float]]] = {}
    for key, value in record(content, "metrics", MetricRecord).items():
        parts = str(key).split(".")
        if len(parts) != 3 or parts[0] not in _SPLITS or parts[1] not in known or not parts[2] or len(key) > 200:
            raise MalformedReply(f"score key {key[:60]!r}: expected <split>.<model>.<metric> with split "
                                 f"{'/'.join(_SPLITS)} and model {'/'.join(sorted(known))}")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                not (math.isnan(value) or 0.0 <= value <= 1.0):
            raise MalformedReply(f"score {key!r} is {_show(value)}, not a fraction in [0, 1] (or NaN: no samples)")
        per_split.setdefault(parts[0], {}).setdefault(parts[1], {})[parts[2]] = float(value)
    cfg = record(content, "config", ConfigRecord)
    digest = _text(cfg, "digest", HEX)
    failure = None
    if "failed_step" in cfg:
        failure = (_text(cfg, "failed_step", max_len=100), _text(cfg, "failure"))
    return per_split, digest, failure

"""Test-only fault injection: make chosen clients misbehave, to test how a run survives it.

Nothing in ``cosmos_pl`` knows of it: the tests install it (:func:`install`), and it wraps what builds a run's
clients, so the round loop, the transports and the Flower node carry no fault code of their own. A test in this
process uses the ``injected_faults`` fixture (``tests/conftest.py``); a test that starts ``cosmos-pl`` or a Flower
SuperNode puts this folder on the child's ``PYTHONPATH`` (:func:`hooks_path.with_hooks`), whose ``sitecustomize``
applies :data:`PATCHES` as their modules are imported when ``$COSMOS_PL_TEST_FAULTS`` is set. What is wrapped:

- the in-process clients (:meth:`cosmos_pl.federated.in_process.InProcessClients.build`) and the Flower server's
  clients (:class:`cosmos_pl.flower.server.FlowerClients`): :func:`wrap`, read when the Runner builds them;
- a Flower node's ``hello`` and ``pseudo_labels`` handlers (:mod:`cosmos_pl.flower.node`): a hostile node.

Set ``COSMOS_PL_TEST_FAULTS`` to a JSON list of ``{"round": r, "client": i, "step": s, "kind": k}``. Task faults
(``step`` is a stage: 'local training', 'pseudo-labels', 'client distillation', 'joint training', 'co-training'):

- ``raise``: the step raises RuntimeError; ``nan``: the model's weights are set to NaN before training, so the
  real non-finite-loss check fails; ``hang``: the model's first forward pass (inside Lightning's training loop,
  or inside inference) sleeps for an hour (use with ``failures.timeout_s``, or to stop a run mid-round in a
  test); ``kill``: the worker process kills itself with SIGKILL (parallel executor only).

Upload faults (``step`` 'upload'): ``shape`` (a row missing), ``dtype`` (float64 values), ``nan_values``,
``negative``, ``row_sum`` (rows scaled by 1.5), ``fingerprint`` (another public set's).

``drop`` (``step`` 'round'): the client sits the round out, as a reference for "left out from that round": it is
asked to train, upload and load nothing that round.

Hello faults (``step`` 'hello', a Flower node only): ``malformed``: the node replies a malformed hello (a client
id that is not an integer, a negative training size, a NaN parameter count, no digest) instead of its own, which
the server must refuse. The node is matched on ``client`` (its ``partition-id``) alone: ``round`` is not read (a
node is greeted when it joins, whatever the round) and may be left out.

Task faults apply to in-process clients (their tasks are wrapped where they run); upload and drop faults to any
transport's clients, where the server receives them. A Flower node whose SuperNode has the variable (and this
folder on its ``PYTHONPATH``) applies the upload and hello faults itself: its pseudo-labels are corrupted before they
are sent, as a hostile node would send them, for tests of a real deployment.
"""

from __future__ import annotations

import copy
import functools
import importlib
import importlib.util
import json
import os
import signal
import time
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Callable, Optional

import torch
from torch import nn

from cosmos_pl.communication import Payload
from cosmos_pl.federated.clients import Clients, Scores, SimulationFacts
from cosmos_pl.objectives.runtime import ClientRuntime
from cosmos_pl.objectives.step import ClientStep, Task
from cosmos_pl.training.client import Client

__all__ = ["ENV", "HELLO_KINDS", "TASK_KINDS", "UPLOAD_KINDS", "Fault", "FaultyClients", "FaultyRuntime", "load",
           "find", "find_hello", "run_with_fault", "corrupt", "wrap", "PATCHES", "install"]

ENV = "COSMOS_PL_TEST_FAULTS"
TASK_KINDS = ("raise", "nan", "hang", "kill")
UPLOAD_KINDS = ("shape", "dtype", "nan_values", "negative", "row_sum", "fingerprint")
HELLO_KINDS = ("malformed",)


@dataclass(frozen=True)
class Fault:
    round: int
    client: int
    step: str
    kind: str


def load() -> list[Fault]:
    """The faults named in ``$COSMOS_PL_TEST_FAULTS`` (none when unset); a hello fault may leave out its round (read
    as -1: not used).

    Raises:
        ValueError: a kind not in :data:`TASK_KINDS`, :data:`UPLOAD_KINDS`, :data:`HELLO_KINDS` or ``drop``.
    """
    text = os.environ.get(ENV)
    if not text:
        return []
    # a hello fault's round is not read (a node is greeted when it joins): it may be left out
    faults = [Fault(int(f.get("round", -1) if f.get("step") == "hello" else f["round"]), int(f["client"]),
                    str(f["step"]), str(f["kind"])) for f in json.loads(text)]
    for f in faults:
        if f.kind not in TASK_KINDS + UPLOAD_KINDS + HELLO_KINDS + ("drop",):
            raise ValueError(f"{ENV}: unknown fault kind {f.kind!r}")
    return faults


def find(faults: list[Fault], rnd: int, client: int, step: str) -> Optional[str]:
    """The kind of fault planned for this client's step in this round, or None."""
    return next((f.kind for f in faults if (f.round, f.client, f.step) == (rnd, client, step)), None)


def find_hello(faults: list[Fault], client: int) -> Optional[str]:
    """The kind of hello fault planned for ``client`` (its round is not read: a node is greeted when it joins), or
    None."""
    return next((f.kind for f in faults if f.step == "hello" and f.client == client), None)


def run_with_fault(_fault_fn: Callable[..., Any], _fault_kind: str, **kwargs: Any) -> Any:
    """Run the task ``_fault_fn(**kwargs)`` after applying the fault (in the worker process)."""
    if _fault_kind == "raise":
        raise RuntimeError("injected fault: the client's step raised")
    if _fault_kind in ("hang", "nan"):  # on a copy: the step fails, and the client's own model must stay clean
        kwargs["model"] = copy.deepcopy(kwargs["model"])
    if _fault_kind == "hang":
        for module in kwargs["model"].modules():  # every one: an objective may call a wrapper's submodules directly
            module.register_forward_pre_hook(lambda module, args: time.sleep(3600))
    if _fault_kind == "kill":
        if torch.multiprocessing.current_process().name == "MainProcess":
            raise RuntimeError("injected fault 'kill' needs executor.kind parallel (it would kill the run itself)")
        os.kill(os.getpid(), signal.SIGKILL)
    if _fault_kind == "nan":
        with torch.no_grad():
            for p in kwargs["model"].parameters():
                p.fill_(float("nan"))
    return _fault_fn(**kwargs)


def corrupt(payload: Payload, kind: str) -> Payload:
    """A copy of ``payload`` made malformed in the way ``kind`` names."""
    values = payload.values.clone()
    fingerprint = payload.public_fingerprint
    if kind == "shape":
        values = values[1:]
    elif kind == "dtype":
        values = values.double()
    elif kind == "nan_values":
        values = values.float()
        values[0, 0] = float("nan")
        values = values.to(payload.values.dtype)
    elif kind == "negative":
        values = values.float()
        values[0, 0] = -0.5
        values = values.to(payload.values.dtype)
    elif kind == "row_sum":
        values = (values.float() * 1.5).to(payload.values.dtype)
    elif kind == "fingerprint":
        fingerprint = "0" * 16
    return Payload(values, payload.indices, payload.num_classes, payload.dtype, fingerprint)


class FaultyRuntime(ClientRuntime):
    """A client runtime whose tasks carry the planned task faults (:func:`run_with_fault`)."""

    faults: list[Fault]

    @classmethod
    def of(cls, runtime: ClientRuntime, faults: list[Fault]) -> "FaultyRuntime":
        """``runtime``'s settings, with ``faults``."""
        faulty = cls(runtime.seed, runtime.clients, runtime.transformations, runtime.trainer, runtime.public,
                     runtime.num_classes)
        faulty.faults = faults
        return faulty

    def _with_fault(self, rnd: int, stage: str, client: int, task: Task) -> Task:
        kind = find(self.faults, rnd, client, stage)
        if kind not in TASK_KINDS:
            return task
        fn, kwargs = task
        return run_with_fault, {"_fault_fn": fn, "_fault_kind": kind, **kwargs}

    def train(self, client: Client, rnd: int, step: ClientStep, target: Optional[torch.Tensor] = None) -> Task:
        return self._with_fault(rnd, step.stage, client.id, super().train(client, rnd, step, target))

    def predict(self, client: Client, rnd: int) -> Task:
        return self._with_fault(rnd, "pseudo-labels", client.id, super().predict(client, rnd))


class FaultyClients(Clients):
    """``clients`` with the planned faults: a dropped client is asked nothing that round (no training, upload or
    weights), an upload fault corrupts what the client sent, and the task faults go into the in-process clients'
    runtime (their ``runtime`` attribute). Everything else is ``clients``' own."""

    def __init__(self, clients: Clients, faults: list[Fault]) -> None:
        self.clients, self.faults, self.infos = clients, faults, clients.infos
        if isinstance(getattr(clients, "runtime", None), ClientRuntime):
            clients.runtime = FaultyRuntime.of(clients.runtime, faults)

    def _taking_part(self, rnd: int, ids: list[int]) -> list[int]:
        return [i for i in ids if find(self.faults, rnd, i, "round") != "drop"]

    def train(self, rnd: int, step: ClientStep, ids: list[int], targets: dict[int, Any]) -> dict[int, Any]:
        ids = self._taking_part(rnd, ids)
        return self.clients.train(rnd, step, ids, targets) if ids else {}

    def upload(self, rnd: int, kind: str, ids: list[int]) -> dict[int, Any]:
        ids = self._taking_part(rnd, ids)
        got = self.clients.upload(rnd, kind, ids) if ids else {}
        for i, item in got.items():
            fault = find(self.faults, rnd, i, "upload")
            if kind != "weights" and isinstance(item, Payload) and fault in UPLOAD_KINDS:
                got[i] = corrupt(item, fault)
        return got

    def load_weights(self, rnd: int, states: dict[int, dict[str, Any]]) -> dict[int, Any]:
        taking_part = set(self._taking_part(rnd, list(states)))
        return self.clients.load_weights(rnd, {i: s for i, s in states.items() if i in taking_part})

    def begin_round(self, rnd: int) -> None:
        self.clients.begin_round(rnd)

    def fail(self, rnd: int, client: int) -> None:
        self.clients.fail(rnd, client)

    def end_round(self, rnd: int, models: dict[int, dict[str, nn.Module]], *,
                  evaluate: bool) -> tuple[Scores, dict[int, Any]]:
        return self.clients.end_round(rnd, models, evaluate=evaluate)

    def pretrain(self, epochs: int, cache: Any = None, key: str = "") -> dict[int, Any]:
        return self.clients.pretrain(epochs, cache, key)

    def round0_losses(self) -> Optional[dict[str, float]]:
        return self.clients.round0_losses()

    def pretrained(self, losses: Optional[dict[str, float]]) -> None:
        self.clients.pretrained(losses)

    def simulation(self) -> Optional[SimulationFacts]:
        return self.clients.simulation()

    def bytes(self, rnd: int) -> dict[str, int]:
        return self.clients.bytes(rnd)

    def state_dict(self) -> dict[str, Any]:
        return self.clients.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.clients.load_state_dict(state)

    def close(self) -> None:
        self.clients.close()


def wrap(clients: Clients, planned: list[Fault]) -> Clients:
    """``clients`` with the ``planned`` faults (:func:`load`; :class:`FaultyClients`), or ``clients`` itself when
    none are planned (normal use)."""
    return FaultyClients(clients, planned) if planned else clients


# --------------------------------------------------------------------------- installing the wrappers
def _patch_in_process(module: ModuleType, set_attr: Callable[..., None]) -> None:
    """The in-process clients, wrapped with the faults planned when they are built."""
    cls = module.InProcessClients
    build = cls.__dict__["build"].__func__

    def faulty_build(klass: type, view: Any, **kwargs: Any) -> Clients:
        return wrap(build(klass, view, **kwargs), load())

    set_attr(cls, "build", classmethod(functools.wraps(build)(faulty_build)))


def _patch_flower_server(module: ModuleType, set_attr: Callable[..., None]) -> None:
    """The Flower server's clients (built by the ServerApp, ``functools.partial(FlowerClients, ...)``), wrapped."""
    flower_clients = module.FlowerClients

    def faulty_flower_clients(*args: Any, **kwargs: Any) -> Clients:
        return wrap(flower_clients(*args, **kwargs), load())

    set_attr(module, "FlowerClients", faulty_flower_clients)


def _patch_node(module: ModuleType, set_attr: Callable[..., None]) -> None:
    """A Flower node's ``hello`` (a ``hello`` fault: a malformed reply, before any work) and ``pseudo_labels`` (an
    ``upload`` fault: the reply's pseudo-labels corrupted, :func:`corrupt`)."""
    from flwr.app import ConfigRecord, RecordDict

    from cosmos_pl.flower import wire

    hello, pseudo_labels = module.hello, module.pseudo_labels

    @functools.wraps(hello)
    def faulty_hello(content: RecordDict, context: Any) -> RecordDict:
        module.check_node_config(context.node_config)  # a bad node config is refused first, as without a fault
        pid = context.node_config.get("partition-id")
        if pid is not None and find_hello(load(), int(pid)) == "malformed":
            return RecordDict({"config": ConfigRecord({"client_id": "one", "train_size": -5,
                                                       "parameters": float("nan"), "backbone": 7})})
        return hello(content, context)

    @functools.wraps(pseudo_labels)
    def faulty_pseudo_labels(content: RecordDict, context: Any) -> RecordDict:
        reply = pseudo_labels(content, context)
        kind = find(load(), int(content["config"]["round"]), int(context.node_config["partition-id"]), "upload")
        if kind not in UPLOAD_KINDS:
            return reply
        arrays, meta = wire.payload_to_record(corrupt(wire.record_to_payload(reply["arrays"], reply["config"]), kind))
        return RecordDict({"arrays": arrays, "config": ConfigRecord(meta), "losses": reply["losses"]})

    set_attr(module, "hello", faulty_hello)
    set_attr(module, "pseudo_labels", faulty_pseudo_labels)


#: The modules whose attributes the faults wrap, each with its patch ``(module, set_attr)``.
PATCHES: dict[str, Callable[[ModuleType, Callable[..., None]], None]] = {
    "cosmos_pl.federated.in_process": _patch_in_process, "cosmos_pl.flower.server": _patch_flower_server,
    "cosmos_pl.flower.node": _patch_node}


def install(set_attr: Callable[..., None] = setattr) -> None:
    """Wrap, in this process, what builds the clients and a Flower node's handlers (module docstring); the Flower
    parts only where ``flwr`` is installed. ``set_attr``: how each attribute is replaced (a test passes
    ``monkeypatch.setattr``, which puts the originals back after it)."""
    for name, patch in PATCHES.items():
        if name.startswith("cosmos_pl.flower.") and importlib.util.find_spec("flwr") is None:
            continue
        patch(importlib.import_module(name), set_attr)

"""Test-only fault injection: make chosen clients misbehave, to test how a run survives it (issue 9).

Set ``COSMOS_PL_TEST_FAULTS`` to a JSON list of ``{"round": r, "client": i, "step": s, "kind": k}``; nothing
reads it in normal use. Task faults (``step`` is a stage: 'local training', 'pseudo-labels', 'client
distillation', 'joint training', 'co-training'):

- ``raise``: the step raises RuntimeError; ``nan``: the model's weights are set to NaN before training, so the
  real non-finite-loss check fails; ``hang``: the model's first forward pass (inside Lightning's training loop,
  or inside inference) sleeps for an hour (use with ``failures.timeout_s``, or to stop a run mid-round in a
  test); ``kill``: the worker process kills itself with SIGKILL (parallel executor only).

Upload faults (``step`` 'upload'): ``shape`` (a row missing), ``dtype`` (float64 values), ``nan_values``,
``negative``, ``row_sum`` (rows scaled by 1.5), ``fingerprint`` (another public set's).

``drop`` (``step`` 'round'): the client sits the round out, as a reference for "left out from that round".
"""

from __future__ import annotations

import copy
import json
import os
import signal
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch

from cosmos_pl.communication import Payload

__all__ = ["ENV", "Fault", "load", "find", "run_with_fault", "corrupt"]

ENV = "COSMOS_PL_TEST_FAULTS"
TASK_KINDS = ("raise", "nan", "hang", "kill")
UPLOAD_KINDS = ("shape", "dtype", "nan_values", "negative", "row_sum", "fingerprint")


@dataclass(frozen=True)
class Fault:
    round: int
    client: int
    step: str
    kind: str


def load() -> list[Fault]:
    """The faults named in ``$COSMOS_PL_TEST_FAULTS`` (none when unset)."""
    text = os.environ.get(ENV)
    if not text:
        return []
    faults = [Fault(int(f["round"]), int(f["client"]), str(f["step"]), str(f["kind"])) for f in json.loads(text)]
    for f in faults:
        if f.kind not in TASK_KINDS + UPLOAD_KINDS + ("drop",):
            raise ValueError(f"{ENV}: unknown fault kind {f.kind!r}")
    return faults


def find(faults: list[Fault], rnd: int, client: int, step: str) -> Optional[str]:
    """The kind of fault planned for this client's step in this round, or None."""
    return next((f.kind for f in faults if (f.round, f.client, f.step) == (rnd, client, step)), None)


def run_with_fault(_fault_fn: Callable[..., Any], _fault_kind: str, **kwargs: Any) -> Any:
    """Run the task ``_fault_fn(**kwargs)`` after applying the fault (in the worker process)."""
    if _fault_kind == "raise":
        raise RuntimeError("injected fault: the client's step raised")
    if _fault_kind in ("hang", "nan"):  # on a copy: the step fails, and the client's own model must stay clean
        kwargs["model"] = copy.deepcopy(kwargs["model"])
    if _fault_kind == "hang":
        kwargs["model"].register_forward_pre_hook(lambda module, args: time.sleep(3600))
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

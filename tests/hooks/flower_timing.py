"""Test-only: a Flower SuperNode's heartbeat interval shortened, for a deployment on one machine that kills a
SuperNode and waits for the SuperLink to mark it offline (``tests/test_flower_deployment.py``); what is exchanged,
and what is accepted or refused, are Flower's own.

With ``$COSMOS_PL_TEST_HEARTBEAT_S`` set in a SuperNode's environment, :mod:`sitecustomize` applies the patches of
:func:`patches`, each right after its module is first imported: the node heartbeats to the SuperLink at that interval
instead of Flower's ``HEARTBEAT_DEFAULT_INTERVAL`` (30 s). The SuperLink marks a node offline once it has missed
``HEARTBEAT_PATIENCE`` (2) of the intervals the node declared, and refuses a restarted node whose key is that of a
node still online; so a SuperNode that was killed is offline, and can come back, 2 x 10 s after its last heartbeat
instead of 2 x 30 s. Flower's SuperLink accepts intervals of at least ``HEARTBEAT_MIN_INTERVAL`` (10 s). Two module
globals take the value: the interval the node declares (``flwr.supernode.fleet_http_connection``) and the period of
its heartbeat sender (``flwr.supercore.heartbeat``: (interval - 5 s) x 0.7..0.9, about every 4 s at 10 s). The
variable is removed from the process's environment once read, so the ClientApps and the SuperExec the node starts
(their task heartbeats to the node, and the node's patience with them) keep Flower's 30 s.
"""

from __future__ import annotations

import os
from types import ModuleType
from typing import Any, Callable

__all__ = ["HEARTBEAT_ENV", "patches"]

HEARTBEAT_ENV = "COSMOS_PL_TEST_HEARTBEAT_S"


def _set(name: str, value: Any) -> Callable[[ModuleType], None]:
    def patch(module: ModuleType) -> None:
        setattr(module, name, value)

    return patch


def patches() -> dict[str, Callable[[ModuleType], None]]:
    """``{module name: patch}`` for ``$COSMOS_PL_TEST_HEARTBEAT_S`` (unset: ``{}``), which is removed from the
    environment here (module docstring)."""
    heartbeat = os.environ.pop(HEARTBEAT_ENV, None)
    if not heartbeat:
        return {}
    interval = float(heartbeat)
    return {"flwr.supernode.fleet_http_connection": _set("HEARTBEAT_DEFAULT_INTERVAL", interval),
            "flwr.supercore.heartbeat": _set("HEARTBEAT_DEFAULT_INTERVAL", interval)}

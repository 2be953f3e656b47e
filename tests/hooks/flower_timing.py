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

With ``$COSMOS_PL_TEST_SQLITE_BUSY_MS`` set in a SuperLink's environment, its SQLite state database waits up to that
many milliseconds for a lock (``PRAGMA busy_timeout``) instead of Flower's 5,000: on a 2-core machine running the rest
of the test suite beside the deployment, a write could hold the lock past 5 s, and the SuperLink then answered a
node's request with "database is locked" (seen failing two clients' round). Nothing else of the database changes.
"""

from __future__ import annotations

import os
from types import ModuleType
from typing import Any, Callable

__all__ = ["BUSY_ENV", "HEARTBEAT_ENV", "patches"]

HEARTBEAT_ENV = "COSMOS_PL_TEST_HEARTBEAT_S"
BUSY_ENV = "COSMOS_PL_TEST_SQLITE_BUSY_MS"


def _set(name: str, value: Any) -> Callable[[ModuleType], None]:
    def patch(module: ModuleType) -> None:
        setattr(module, name, value)

    return patch


def patches() -> dict[str, Callable[[ModuleType], None]]:
    """``{module name: patch}`` for ``$COSMOS_PL_TEST_HEARTBEAT_S`` and ``$COSMOS_PL_TEST_SQLITE_BUSY_MS`` (neither
    set: ``{}``), which are removed from the environment here (module docstring)."""
    found: dict[str, Callable[[ModuleType], None]] = {}
    heartbeat = os.environ.pop(HEARTBEAT_ENV, None)
    if heartbeat:
        interval = float(heartbeat)
        found.update({"flwr.supernode.fleet_http_connection": _set("HEARTBEAT_DEFAULT_INTERVAL", interval),
                      "flwr.supercore.heartbeat": _set("HEARTBEAT_DEFAULT_INTERVAL", interval)})
    busy = os.environ.pop(BUSY_ENV, None)
    if busy:
        def wait_longer(module: ModuleType) -> None:  # sql_mixin reads the pragmas it imported, at each connection
            module.SQLITE_PRAGMAS = tuple((k, str(int(busy)) if k == "busy_timeout" else v)
                                          for k, v in module.SQLITE_PRAGMAS)

        found["flwr.supercore.sql_mixin"] = wait_longer
    return found

"""Test-only: Flower's waits shortened for a deployment on one machine (``tests/test_flower_deployment.py``), so that
the test waits less for what it tests; what is exchanged, and what is accepted or refused, are Flower's own.

:func:`sitecustomize` applies them, each right after its module is first imported, in a process whose variable is
set:

- ``$COSMOS_PL_TEST_HEARTBEAT_S`` (a SuperNode): the interval of the node's heartbeats to the SuperLink, Flower's
  ``HEARTBEAT_DEFAULT_INTERVAL`` (30 s), for this node only. The SuperLink marks a node offline once it has missed
  ``HEARTBEAT_PATIENCE`` (2) of the intervals the node declared, and a restarted node whose key is that of a node
  still online is refused; so a SuperNode that was killed can come back 2 x 10 s after its last heartbeat instead
  of 2 x 30 s. Flower's SuperLink accepts intervals of at least ``HEARTBEAT_MIN_INTERVAL`` (10 s). Two module
  globals take the value: the interval the node declares (``flwr.supernode.fleet_http_connection``) and the period
  of its heartbeat sender (``flwr.supercore.heartbeat``: (interval - 5 s) x 0.7..0.9, about every 4 s). The variable
  is removed from the process's environment once read, so the ClientApps and the SuperExec it starts (their own
  task heartbeats to the node, and the node's patience with them) keep Flower's 30 s.
- ``$COSMOS_PL_TEST_POLL_S`` (a SuperLink, whose ServerApps inherit it): the pause of the ServerApp's poll for the
  replies to the messages it sent (``flwr.superlink.grid.http_grid``: every 3 s in Flower), so that every message
  exchange waits less for the server to see its replies. Only the ServerApp polls faster (one request a second while
  it waits): the SuperNodes keep their 3 s, as the SuperLink's SQLite state is shared by every request (under
  heavy load a request has been seen failing with "database is locked", which stops its node).
"""

from __future__ import annotations

import os
import time
from types import ModuleType
from typing import Any, Callable

__all__ = ["HEARTBEAT_ENV", "POLL_ENV", "patches"]

HEARTBEAT_ENV = "COSMOS_PL_TEST_HEARTBEAT_S"
POLL_ENV = "COSMOS_PL_TEST_POLL_S"


class _CappedSleep:
    """The ``time`` module as a patched module sees it: every attribute is ``time``'s, but ``sleep`` pauses at most
    ``cap`` seconds."""

    def __init__(self, cap: float) -> None:
        self.cap = cap

    def sleep(self, seconds: float) -> None:
        time.sleep(min(seconds, self.cap))

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


def _set(name: str, value: Any) -> Callable[[ModuleType], None]:
    def patch(module: ModuleType) -> None:
        setattr(module, name, value)

    return patch


def patches() -> dict[str, Callable[[ModuleType], None]]:
    """``{module name: patch}`` for the variables set in this process's environment (none: ``{}``); the heartbeat's
    variable is removed from the environment here (module docstring)."""
    out: dict[str, Callable[[ModuleType], None]] = {}
    heartbeat = os.environ.pop(HEARTBEAT_ENV, None)
    if heartbeat:
        interval = float(heartbeat)
        out["flwr.supernode.fleet_http_connection"] = _set("HEARTBEAT_DEFAULT_INTERVAL", interval)
        out["flwr.supercore.heartbeat"] = _set("HEARTBEAT_DEFAULT_INTERVAL", interval)
    poll = os.environ.get(POLL_ENV)
    if poll:
        capped = _CappedSleep(float(poll))
        out["flwr.superlink.grid.http_grid"] = _set("time", capped)
    return out

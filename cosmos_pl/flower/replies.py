"""A node's reply as the server reads it: the content, or the failure the node reports (a step that failed, a site
whose data cannot be used, a node restarted since its hello)."""

from __future__ import annotations

from typing import Any

from flwr.app import RecordDict

from cosmos_pl.errors import UserError
from cosmos_pl.federated.executor import TaskFailure

__all__ = ["NodeRestarted", "NodesMissing", "SiteFailure", "read_reply"]


def read_reply(content: RecordDict) -> Any:
    """A node's reply content, or the client's failure it reports (``cosmos_pl.flower.client_app.respond``)."""
    if "error" not in content:
        return content
    error = content["error"]
    if "client_id" in error:  # a site's data error: it names the client it holds
        return SiteFailure(str(error["reason"]), int(error["client_id"]))
    if error.get("type") == "NotSetUp":
        return NodeRestarted(str(error["reason"]))
    return TaskFailure(str(error["reason"]), str(error["stage"]) if "stage" in error else None)


class SiteFailure(TaskFailure):
    """A node's hello refused with the client it holds: its site's own data cannot be used."""

    def __init__(self, reason: str, client: int) -> None:
        super().__init__(reason)
        self.client = client


class NodeRestarted(TaskFailure):
    """A node answered that it has had no ``query.hello`` since it started: it was restarted under its old node id."""


class NodesMissing(UserError):
    """Fewer nodes than clients joined before round 0: ``join_timeout_s`` passed, or every connected node answered
    and some refused."""

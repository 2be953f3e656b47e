"""A node's reply as the server reads it: the content, or the failure the node reports (a step that failed, a site
whose data cannot be used, a node restarted since its hello)."""

from __future__ import annotations

from typing import Any, Optional

from flwr.app import RecordDict

from cosmos_pl.errors import UserError
from cosmos_pl.execution.task_failure import TaskFailure
from cosmos_pl.flower.validate import error_reply

__all__ = ["NoReply", "NodeRestarted", "NodesMissing", "SiteFailure", "read_reply"]


def read_reply(content: RecordDict, num_clients: Optional[int] = None) -> Any:
    """A node's reply content, or the client's failure it reports (``cosmos_pl.flower.client_app.respond``); an
    error record's fields are read by :func:`cosmos_pl.flower.validate.error_reply` (a client id outside
    ``0..num_clients-1`` is not taken). The content itself is checked where it is used."""
    if not isinstance(content, RecordDict):
        return TaskFailure(f"rejected: malformed reply (a {type(content).__name__}, not a RecordDict)")
    if "error" not in content:
        return content
    error = content["error"]
    reason, stage, cid, kind = error_reply(error, num_clients)
    if kind == "SiteDataError" and cid is not None:  # a site's data error: it names the client it holds
        identity = error.get("identity") if hasattr(error, "get") else None
        return SiteFailure(reason, cid, identity if isinstance(identity, str) else "")
    if kind == "NotSetUp":
        return NodeRestarted(reason)
    return TaskFailure(reason, stage)


class SiteFailure(TaskFailure):
    """A node's hello refused with the client it holds and the node's token: its site's own data cannot be used."""

    def __init__(self, reason: str, client: int, identity: str = "") -> None:
        super().__init__(reason)
        self.client, self.identity = client, identity


class NoReply(TaskFailure):
    """A node sent no reply in time (it stopped, or cannot be reached): it is asked again, not refused."""


class NodeRestarted(TaskFailure):
    """A node answered that it has had no ``query.hello`` since it started: it was restarted under its old node id."""


class NodesMissing(UserError):
    """Fewer nodes than clients joined before round 0: ``join_timeout_s`` passed, or every connected node answered
    and some refused."""

"""A process that must hold no client's data: a Flower deployment's server.

In a deployment the ServerApp holds U, the class list and what each node reports of its client; it must never build
a client's data, nor load the data set a config names (which would hold every client's data). It runs inside
:func:`no_client_data`, under which every constructor of such data (a data set's :class:`~cosmos_pl.data.ImageData`,
a client's :class:`~cosmos_pl.data.ClientData`, a site's folder read by :func:`~cosmos_pl.data.load_site`) raises
:class:`ClientDataForbidden` instead: a code path that would quietly put client data on the server fails loudly.
"""

from __future__ import annotations

import contextlib
from typing import Iterator, Optional

__all__ = ["ClientDataForbidden", "check_client_data_allowed", "no_client_data"]

_forbidden: Optional[str] = None  # why this process may not hold client data (None: it may)


class ClientDataForbidden(RuntimeError):
    """Client data were about to be built in a process that must hold none (a deployment's server)."""


@contextlib.contextmanager
def no_client_data(reason: str) -> Iterator[None]:
    """Inside this block, building client data raises :class:`ClientDataForbidden` naming ``reason``."""
    global _forbidden
    before, _forbidden = _forbidden, reason
    try:
        yield
    finally:
        _forbidden = before


def check_client_data_allowed(what: str) -> None:
    """Called by every constructor of client data (``what`` names it).

    Raises:
        ClientDataForbidden: inside :func:`no_client_data`.
    """
    if _forbidden is not None:
        raise ClientDataForbidden(f"{what} was about to be built here, and {_forbidden}")

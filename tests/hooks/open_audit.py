"""Test-only: list every path a process opens, so a test can show which files a deployment's processes read.

With ``$COSMOS_PL_AUDIT_OPENS`` set to a file, :func:`audit_opens` appends every path this process opens to it
(Python's audit hooks, :func:`sys.addaudithook`). ``sitecustomize`` (this folder on ``PYTHONPATH``) calls it when a
process starts: the localhost deployment test (``tests/test_flower_deployment.py``) gives the SuperLink one file and
each SuperNode its own, which the ServerApp and ClientApp processes they start inherit, then checks that the server
side opens no file of any site and each node only its own site's.
"""

from __future__ import annotations

import os
import sys

__all__ = ["ENV", "audit_opens"]

ENV = "COSMOS_PL_AUDIT_OPENS"
_installed = False


def audit_opens() -> None:
    """Install the hook once per process when ``$COSMOS_PL_AUDIT_OPENS`` is set (module docstring)."""
    global _installed
    path = os.environ.get(ENV)
    if not path or _installed:
        return
    _installed = True
    log = open(path, "a", buffering=1)  # line-buffered: several processes append to one file

    def hook(event: str, args: tuple) -> None:
        if event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
            log.write(f"{os.fsdecode(args[0])}\n")

    sys.addaudithook(hook)

"""Test-only: with this folder on a process's ``PYTHONPATH`` (:func:`hooks_path.with_hooks`), Python runs this file
at the process's start; it installs the test hooks whose variables are set, and nothing otherwise.

- ``$COSMOS_PL_TEST_FAULTS``: the test faults (:mod:`fault_injection`), each of its :data:`fault_injection.PATCHES`
  applied right after its module is first imported; nothing else is imported here, so a process that never loads
  those modules (a SuperLink, the ``flwr`` command) loads neither torch nor cosmos-pl for them;
- ``$COSMOS_PL_AUDIT_OPENS``: the list of the paths the process opens (:mod:`open_audit`).

A Flower SuperLink and SuperNode pass their environment on to the ServerApp and ClientApp processes they start, and
the parallel executor to its workers, so these get the hooks too.
"""

import importlib.abc
import os
import sys
from typing import Any

#: The modules :data:`fault_injection.PATCHES` patches (its keys), named here so that nothing is imported before
#: one of them is.
PATCHED = ("cosmos_pl.federated.in_process", "cosmos_pl.flower.server", "cosmos_pl.flower.node")


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Finds each module of :data:`PATCHED` with the other finders, and applies its fault patch right after the
    module is executed (once per process)."""

    def __init__(self) -> None:
        self.pending = set(PATCHED)

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name not in self.pending:
            return None
        spec = next((s for s in (f.find_spec(name, path, target) for f in sys.meta_path
                                 if f is not self and hasattr(f, "find_spec")) if s is not None), None)
        if spec is None or spec.loader is None:
            return spec
        self.pending.discard(name)
        exec_module = spec.loader.exec_module

        def exec_and_patch(module: Any) -> None:
            exec_module(module)
            import fault_injection

            fault_injection.PATCHES[name](module, setattr)

        spec.loader.exec_module = exec_and_patch  # this spec's own loader: other modules load as usual
        return spec


if os.environ.get("COSMOS_PL_TEST_FAULTS"):
    sys.meta_path.insert(0, _PatchOnImport())
if os.environ.get("COSMOS_PL_AUDIT_OPENS"):
    import open_audit

    open_audit.audit_opens()

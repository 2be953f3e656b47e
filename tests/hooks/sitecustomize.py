"""Test-only: with this folder on a process's ``PYTHONPATH`` (:func:`hooks_path.with_hooks`), Python runs this file
at the process's start; it installs the test hooks whose variables are set, and nothing otherwise.

- ``$COSMOS_PL_TEST_FAULTS``: the test faults (:mod:`fault_injection`), each of its :data:`fault_injection.PATCHES`
  applied right after its module is first imported; nothing else is imported here, so a process that never loads
  those modules (a SuperLink, the ``flwr`` command) loads neither torch nor cosmos-pl for them;
- ``$COSMOS_PL_AUDIT_OPENS``: the list of the paths the process opens (:mod:`open_audit`);
- ``$COSMOS_PL_TEST_HEARTBEAT_S`` (a Flower SuperNode): its heartbeat interval shortened, and
  ``$COSMOS_PL_TEST_SQLITE_BUSY_MS`` (a SuperLink): its database's wait for a lock lengthened (:mod:`flower_timing`),
  each patch applied right after its Flower module is first imported.

A Flower SuperLink and SuperNode pass their environment on to the ServerApp and ClientApp processes they start, and
the parallel executor to its workers, so these get the hooks too (but for the heartbeat's, which
:mod:`flower_timing` keeps to the SuperNode itself).
"""

import importlib.abc
import os
import sys
from typing import Any, Callable

#: The modules :data:`fault_injection.PATCHES` patches (its keys), named here so that nothing is imported before
#: one of them is.
PATCHED = ("cosmos_pl.federated.in_process", "cosmos_pl.flower.server", "cosmos_pl.flower.node")


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Finds each module of ``patches`` (``{name: patch}``) with the other finders, and calls its patch with the
    module right after the module is executed (once per process)."""

    def __init__(self, patches: "dict[str, Callable[[Any], None]]") -> None:
        self.pending = dict(patches)

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name not in self.pending:
            return None
        spec = next((s for s in (f.find_spec(name, path, target) for f in sys.meta_path
                                 if f is not self and hasattr(f, "find_spec")) if s is not None), None)
        if spec is None or spec.loader is None:
            return spec
        patch = self.pending.pop(name)
        exec_module = spec.loader.exec_module

        def exec_and_patch(module: Any) -> None:
            exec_module(module)
            patch(module)

        spec.loader.exec_module = exec_and_patch  # this spec's own loader: other modules load as usual
        return spec


def _fault_patch(name: str) -> "Callable[[Any], None]":
    def patch(module: Any) -> None:
        import fault_injection

        fault_injection.PATCHES[name](module, setattr)

    return patch


_patches: "dict[str, Callable[[Any], None]]" = {}
if os.environ.get("COSMOS_PL_TEST_FAULTS"):
    _patches.update({name: _fault_patch(name) for name in PATCHED})
if os.environ.get("COSMOS_PL_TEST_HEARTBEAT_S") or os.environ.get("COSMOS_PL_TEST_SQLITE_BUSY_MS"):
    import flower_timing

    _patches.update(flower_timing.patches())
if _patches:
    sys.meta_path.insert(0, _PatchOnImport(_patches))
if os.environ.get("COSMOS_PL_AUDIT_OPENS"):
    import open_audit

    open_audit.audit_opens()

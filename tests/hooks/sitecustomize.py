"""Test-only: with this folder on a process's ``PYTHONPATH`` (:func:`hooks_path.with_hooks`), Python runs this file
at the process's start; it installs the test hooks whose variables are set, and nothing otherwise.

- ``$COSMOS_PL_TEST_FAULTS``: the test faults (:mod:`fault_injection`), each wrapper as its module is imported;
- ``$COSMOS_PL_AUDIT_OPENS``: the list of the paths the process opens (:mod:`open_audit`).

A Flower SuperLink and SuperNode pass their environment on to the ServerApp and ClientApp processes they start, and
the parallel executor to its workers, so these get the hooks too.
"""

import os

if os.environ.get("COSMOS_PL_TEST_FAULTS"):
    import fault_injection

    fault_injection.install_on_import()
if os.environ.get("COSMOS_PL_AUDIT_OPENS"):
    import open_audit

    open_audit.audit_opens()

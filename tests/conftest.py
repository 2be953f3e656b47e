import os

import pytest

os.environ.setdefault("WANDB_MODE", "disabled")

# Under pytest-xdist (`make test` runs `pytest -n auto`) each test worker is pinned to its own share of the
# cores, before torch is imported: two workers with every core each would slow each other down many times over (OpenMP
# oversubscription). cosmos-pl sizes its thread counts from the affinity mask (executor.available_cpus), and
# subprocesses started by tests inherit it.
_worker = os.environ.get("PYTEST_XDIST_WORKER", "")
if _worker.startswith("gw") and hasattr(os, "sched_setaffinity"):
    _cpus = sorted(os.sched_getaffinity(0))
    _count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    _index = int(_worker[2:])
    if 1 < _count <= len(_cpus):
        _mine = set(_cpus[_index::_count])
        os.sched_setaffinity(0, _mine)
        os.environ["OMP_NUM_THREADS"] = str(len(_mine))


@pytest.fixture(scope="session")
def repo_root():
    from pathlib import Path

    return Path(__file__).resolve().parents[1]

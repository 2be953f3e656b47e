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


# The Flower tests are the longest (a localhost deployment, a simulation) and mostly wait on other processes: started
# first, on different workers, they overlap with the rest of the suite instead of running alone at its end.
# pytest-xdist hands each of its W workers a first chunk of max(2, N // W // 4) consecutive tests: the deployment
# opens the first chunk, the simulation the second.
_FIRST = ("test_flower_deployment.py", "test_flower_simulation.py")


def pytest_collection_modifyitems(config, items):
    first = [item for name in _FIRST for item in items if item.path.name == name]
    rest = [item for item in items if item.path.name not in _FIRST]
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    chunk = max(2, len(items) // workers // 4) if workers > 1 else 1
    order = first[:1] + rest[:chunk - 1] + first[1:] + rest[chunk - 1:]
    items[:] = order

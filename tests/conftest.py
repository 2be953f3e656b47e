import os
import sys
import time
from pathlib import Path

import pytest

os.environ.setdefault("WANDB_MODE", "disabled")
# the test-only hooks (tests/hooks: the test faults, the audit of opened paths), importable by the tests and by the
# executor's spawned workers, which start with this process's sys.path
sys.path.append(str(Path(__file__).resolve().parent / "hooks"))

# Under pytest-xdist each test worker is pinned to its own share of the cores, before torch is imported: two workers
# with every core each would slow each other down many times over (OpenMP oversubscription). With more workers than
# cores (`pytest -n N`, N above the core count) the workers take the cores in turn, one each. cosmos-pl sizes its
# thread counts from the affinity mask (devices.available_cpus), and subprocesses started by tests inherit it.
_worker = os.environ.get("PYTEST_XDIST_WORKER", "")
if _worker.startswith("gw") and hasattr(os, "sched_setaffinity"):
    _cpus = sorted(os.sched_getaffinity(0))
    _count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    _index = int(_worker[2:])
    if _count > 1 and len(_cpus) > 1:
        _mine = set(_cpus[_index::_count]) if _count <= len(_cpus) else {_cpus[_index % len(_cpus)]}
        os.sched_setaffinity(0, _mine)
        os.environ["OMP_NUM_THREADS"] = str(len(_mine))


# How long a test waits for a process it started (a training run, a Flower federation, a script) before calling it
# hung. A guard against hangs only, far above any run's time: `make test` runs one worker more than cores, and a
# Flower test's processes share those cores with the other workers, so a run taking 70 s alone took 700 s there.
PROCESS_TIMEOUT_S = 1800


@pytest.fixture
def injected_faults(monkeypatch):
    """The test faults installed in this process (tests/hooks/fault_injection.py): the clients a Runner builds and a
    Flower node's handlers apply the faults ``$COSMOS_PL_TEST_FAULTS`` plans when they run; undone after the test.
    Returns the module."""
    import fault_injection

    fault_injection.install(monkeypatch.setattr)
    return fault_injection


@pytest.fixture
def restore_flags():
    """torch's process-wide numerics flags as they were before the test (``trainer.deterministic`` sets them)."""
    import torch

    before = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
              torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark)
    yield
    torch.use_deterministic_algorithms(before[0], warn_only=before[1])
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = before[2], before[3]


@pytest.fixture
def spawned(monkeypatch):
    """multiprocessing's spawn faked: the executor's workers never run; each one started is recorded as (its args,
    a copy of ``os.environ`` at its start, what the child would inherit)."""
    import multiprocessing

    started = []

    class Child:
        def __init__(self, target, args, daemon):
            self.args = args

        def start(self):
            started.append((self.args, dict(os.environ)))

    class End:
        def close(self):
            pass

    class Context:
        Process = Child

        @staticmethod
        def Pipe(duplex):
            return End(), End()

    monkeypatch.setattr(multiprocessing, "get_context", lambda method: Context())
    return started


@pytest.fixture(scope="session")
def repo_root():
    from pathlib import Path

    return Path(__file__).resolve().parents[1]


# The Flower tests are the longest (a localhost deployment, a simulation): started at once, on different workers,
# they overlap with the rest of the suite instead of running alone at its end. `make test` runs `pytest --dist
# loadgroup --no-loadscope-reorder`: a module whose tests share a costly module fixture is one group (`xdist_group`),
# given whole to one worker; the work goes out in this order, the first unit to the first worker, the second to the
# second, then to whichever worker has at most two tests waiting. So the deployment, the simulation and the Slurm
# cluster's comparison (which waits on its scheduler and the local comparison as much as it computes) come first.
_FIRST = ("test_tls_deployment_of_sites_with_their_own_data_and_keys", "test_simulation_metrics_equal_the_in_process_run",
          "test_the_slurm_comparison_equals_the_local_one")


def pytest_collection_modifyitems(config, items):
    first = [item for name in _FIRST for item in items if item.name == name]
    items[:] = first + [item for item in items if item.name not in _FIRST]


# ----------------------------------------------------------------------------------- runs shared by the whole run
# Several tests compare their run with the same uninterrupted digits run (resume, executors, determinism): it is
# trained once per pytest run, in whichever worker asks first, into a folder every worker sees (pytest-xdist's
# common base temp), under a file lock; the others wait for it and read the same files. With one torch thread the
# numbers do not depend on the process or worker that made them (the tests that compare records check exactly that).
SMALL_DIGITS = ["--rounds", "2", "--data.num_clients", "5", "--clients.pretrain_epochs", "1",
                "--algorithm.init_args.ptc_epochs", "1", "--algorithm.init_args.teacher_epochs", "1",
                "--wandb.mode", "disabled", "--executor.threads_per_worker", "1"]


def small_digits_argv(repo_root: Path, run_dir: Path, *extra: str) -> list[str]:
    """``cosmos-pl fit`` arguments of the small digits run (COSMOS, 5 clients, rounds 0..2, one epoch per stage)."""
    return ["fit", "--config", str(repo_root / "configs/digits_smoke.yaml"), "--run_dir", str(run_dir), *SMALL_DIGITS,
            *extra]


def _shared_run(tmp_path_factory, name: str, argv_of) -> Path:
    from filelock import FileLock

    from cosmos_pl.cli import main

    base = tmp_path_factory.getbasetemp()
    shared = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "shared-runs"
    shared.mkdir(exist_ok=True)
    run_dir = shared / name
    with FileLock(str(shared / f"{name}.lock")):
        if not (run_dir / "summary.json").is_file():
            assert main(argv_of(run_dir)) == 0
    return run_dir


@pytest.fixture(scope="session")
def small_digits_run(repo_root, tmp_path_factory) -> Path:
    """The small digits run, uninterrupted, trained once per pytest run (read its files; never write into it)."""
    return _shared_run(tmp_path_factory, "small_digits", lambda d: small_digits_argv(repo_root, d))


@pytest.fixture(scope="session")
def smoke_run(repo_root, tmp_path_factory) -> Path:
    """configs/digits_smoke.yaml as it is (10 clients in 5 class groups), trained once per pytest run."""
    return _shared_run(tmp_path_factory, "digits_smoke", lambda d: [
        "fit", "--config", str(repo_root / "configs/digits_smoke.yaml"), "--run_dir", str(d), "--wandb.mode",
        "disabled"])


# small enough for CI: one round, 5 clients, one epoch per stage, two pairs side by side with one thread each
FAST = ["--rounds", "1", "--data.num_clients", "5", "--clients.pretrain_epochs", "1", "--algorithm.ptc_epochs", "1",
        "--algorithm.teacher_epochs", "1", "--wandb.mode", "disabled"]


@pytest.fixture(scope="session")
def compared(repo_root, tmp_path_factory):
    """cosmos and fedmd x seeds 0, 1 with --launcher local, two pairs side by side, W&B offline: ``(OUT, argv)``,
    computed once per pytest run into a folder every worker sees (tests/test_compare_end_to_end.py and
    tests/test_slurm_cluster.py compare with it; read its files, never change them)."""
    from filelock import FileLock

    from cosmos_pl.cli import main

    base = tmp_path_factory.getbasetemp()
    shared = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "shared-runs"
    shared.mkdir(exist_ok=True)
    out = shared / "digits-ab"  # the folder's name is the comparison's W&B group
    argv = ["compare", "--config", str(repo_root / "configs/digits_smoke.yaml"), "--algorithms", "cosmos,fedmd",
            "--seeds", "0,1", "--jobs", "2", "--out", str(out), *FAST, "--wandb.mode", "offline"]
    with FileLock(str(shared / "digits-ab.lock")):
        if not (out / "comparison.csv").is_file():
            assert main(argv) == 0
    return out, argv


def with_out(argv: list[str], out: Path) -> list[str]:
    """``argv`` (a ``compare`` command line, as ``compared`` returns it) with its ``--out`` folder replaced by
    ``out``."""
    at = argv.index("--out")
    return [*argv[:at], "--out", str(out), *argv[at + 2:]]


def until(check, what: str, timeout_s: float = 300, every_s: float = 0.2, proc=None):
    """Poll ``check()`` every ``every_s`` seconds until it returns something true, and return that. Fails the test
    after ``timeout_s`` seconds, naming ``what`` it waited for, or once ``proc`` (a ``Popen`` the wait depends on)
    has exited, with its output."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = check()
        if got:
            return got
        assert proc is None or proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, f"timed out after {timeout_s:.0f} s waiting for {what}"
        time.sleep(every_s)

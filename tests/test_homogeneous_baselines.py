"""pFedCK, FedSelect and pFedHN on both transports, and resumed after SIGKILL.

Each runs configs/digits_flower.yaml with every client on one backbone (3 clients, one per class group, rounds 0..3,
one torch thread per client): in-process with ``cosmos-pl fit``, on Flower's simulation engine (3 virtual SuperNodes),
and in-process again SIGKILLed in round 3 and resumed with ``--resume``. Each is set so that its server state is
exercised in round 3: FedSelect grows masks every round, pFedCK averages a cluster of two clients, and pFedHN's round
3 is its hypernetwork's second step (its momentum comes from the checkpoint). Every client step runs the same code
with the same seeds on either transport, and each algorithm's state (pFedHN's hypernetwork and its optimizer) is in
the round checkpoint while the clients' (FedSelect's masks, pFedCK's interactive model, pFedHN's generation) rides in
their models, so metrics.csv and clients.csv must be identical byte for byte all three ways.
"""

import csv
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import PROCESS_TIMEOUT_S
from hooks_path import with_hooks

pytest.importorskip("flwr", reason="the [flower] extra is not installed (make test installs it)")

# subprocess runs and a Flower federation; on one worker, which makes the module's runs once (`--dist loadgroup`)
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("homogeneous_baselines")]

CLIENTS = 3
# algorithm -> the stage its round starts with (where the stall that stops the run in round 3 is planted)
FIRST_STAGE = {"fedselect": "selective training", "pfedck": "mutual distillation", "pfedhn": "inner steps"}
SETTINGS = {"fedselect": "--algorithm.every 1", "pfedck": "--algorithm.num_clusters 2", "pfedhn": ""}
COMMON = "--rounds 3 --clients.backbones [test_efficientnet]"


def _every_core() -> None:
    # a pytest-xdist worker is pinned to one core (conftest.py); Ray sizes its pool of virtual nodes by the cores
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, range(os.cpu_count() or 1))


def _more(algorithm):
    return f"{COMMON} {SETTINGS[algorithm]}".strip()


def _fit_argv(algorithm, run_dir):
    return ["fit", "--config", "configs/digits_flower.yaml", "--algorithm", algorithm, "--run_dir", str(run_dir),
            "--data.num_clients", str(CLIENTS), *_more(algorithm).split()]


def _start(argv, cwd, log, env=None):
    return subprocess.Popen(argv, cwd=cwd, stdout=open(log, "w"), stderr=subprocess.STDOUT, preexec_fn=_every_core,
                            env=env)


def _finish(proc, log, status=0):
    try:
        assert proc.wait(timeout=PROCESS_TIMEOUT_S) == status, log.read_text()[-5000:]
    finally:
        proc.kill()


def _same_records(a, b, what):
    for name in ("metrics.csv", "clients.csv"):
        assert (a / name).read_text() == (b / name).read_text(), (what, name)


@pytest.fixture(scope="module")
def runs(repo_root, tmp_path_factory):
    """In-process and Flower runs of the three algorithms, side by side: ``{kind: {algorithm: run_dir}}``."""
    tmp = tmp_path_factory.mktemp("homogeneous")
    local = {a: tmp / f"in_process_{a}" for a in FIRST_STAGE}
    flower = {a: tmp / f"flower_{a}" for a in FIRST_STAGE}
    fits = "; ".join(f"assert main({_fit_argv(a, local[a])!r}) == 0" for a in FIRST_STAGE)
    logs = tmp / "in_process.log", tmp / "flower.log"
    in_process = _start([sys.executable, "-c", f"from cosmos_pl.cli import main; {fits}"], repo_root, logs[0])
    simulation = _start([sys.executable, str(repo_root / "tests" / "flower_simulation.py"), str(tmp / "nodes"),
                         str(CLIENTS), *(f"{flower[a]}:{a}:{_more(a)}" for a in FIRST_STAGE)], repo_root, logs[1])
    _finish(in_process, logs[0])
    _finish(simulation, logs[1])
    return {"in_process": local, "flower": flower, "tmp": tmp}


@pytest.mark.parametrize("algorithm", sorted(FIRST_STAGE))
def test_flower_simulation_gives_the_in_process_records(runs, algorithm):
    local, flower = runs["in_process"][algorithm], runs["flower"][algorithm]
    assert (flower / "summary.json").is_file(), (runs["tmp"] / "flower.log").read_text()[-5000:]
    _same_records(flower, local, algorithm)
    metrics = list(csv.DictReader((flower / "metrics.csv").open()))
    assert [r["round"] for r in metrics] == ["0", "1", "2", "3"] and all(r["failed_clients"] == "0" for r in metrics)
    traffic = list(csv.DictReader((flower / "traffic.csv").open()))
    for r in metrics[1:]:  # every client sent its weights and loaded the server's, every round
        for message in ("query.weights", "train.load_weights"):
            assert sum(t["round"] == r["round"] and t["message"] == message for t in traffic) == CLIENTS, message


@pytest.mark.parametrize("algorithm", sorted(FIRST_STAGE))
def test_sigkill_in_round_3_then_resume_gives_the_uninterrupted_records(runs, repo_root, algorithm):
    run_dir = runs["tmp"] / f"killed_{algorithm}"
    log = runs["tmp"] / f"killed_{algorithm}.log"
    stall = json.dumps([{"round": 3, "client": 0, "step": FIRST_STAGE[algorithm], "kind": "hang"}])
    env = with_hooks({**os.environ, "COSMOS_PL_TEST_FAULTS": stall})
    proc = _start([sys.executable, "-m", "cosmos_pl.cli", *_fit_argv(algorithm, run_dir)], repo_root, log, env)
    start = time.monotonic()
    while not (run_dir / "checkpoints" / "round-0002.pt").exists():
        assert proc.poll() is None, log.read_text()[-5000:]
        assert time.monotonic() - start < PROCESS_TIMEOUT_S, "round 2 did not finish"
        time.sleep(0.05)
    time.sleep(3)  # round 3's first stage of client 0 has begun, inside Lightning, and stalls
    proc.send_signal(signal.SIGKILL)
    _finish(proc, log, -signal.SIGKILL)
    assert not (run_dir / "summary.json").exists()
    env = {k: v for k, v in os.environ.items() if k != "COSMOS_PL_TEST_FAULTS"}
    resumed = _start([sys.executable, "-m", "cosmos_pl.cli", "fit", "--resume", str(run_dir)], repo_root,
                     log.with_suffix(".resume.log"), env)
    _finish(resumed, log.with_suffix(".resume.log"))
    _same_records(run_dir, runs["in_process"][algorithm], algorithm)

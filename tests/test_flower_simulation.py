"""Flower's simulation engine gives the in-process run's numbers, for COSMOS and FedMD and for pFedCK, FedSelect
and pFedHN; and those three, SIGKILLed in round 3 and resumed, give them too.

Every run is configs/digits_flower.yaml with 3 clients, one per class group, and one torch thread per client; one
Flower simulation (3 virtual SuperNodes, one Ray start: ``tests/flower_simulation.py``) runs all five in turn.
Every client step runs the same code with the same seeds on either transport, and only what each algorithm sends
crosses the wire, so metrics.csv and clients.csv must be identical byte for byte:

- COSMOS and FedMD (rounds 0..2): the simulation against ``cosmos-pl fit`` of the same config, the two in one
  process; traffic.csv must show every upload's bytes as metrics.csv counts them;
- pFedCK, FedSelect and pFedHN, with every client on one backbone (rounds 0..3), each set so that its server state
  is exercised in round 3: FedSelect grows masks every round, pFedCK averages a cluster of two clients, and pFedHN's
  round 3 is its hypernetwork's second step (its momentum comes from the checkpoint). Each runs in-process with
  ``cosmos-pl fit``, stalls in round 3 (a test fault), is SIGKILLed there, and is resumed with ``--resume``; its
  records must equal the simulation's. That one comparison checks both transports and the resume: rounds 0..2 of
  the resumed run's records are those the in-process run made before it was killed (the same code as an
  uninterrupted run; kept in its round-2 checkpoint), so they must equal the simulation's, and its round 3 ran from
  the round-2 checkpoint (pFedHN's hypernetwork and optimizer are in it; the clients' state, FedSelect's masks,
  pFedCK's interactive model, pFedHN's generation, rides in their models), so it must equal the simulation's
  uninterrupted round 3. A deviation of either (transport or resume) makes them differ; only the same deviation in
  both, in round 3 alone, would not, and an uninterrupted in-process run of each (one more Lightning process, three
  more fits) is what that would take.

All the runs start from the module's fixture and run side by side (the numbers do not depend on what else runs,
with one torch thread each): the simulation first, then, once its nodes have been greeted, the in-process COSMOS and
FedMD and the three runs to be killed (Ray gives its raylet a fixed 30 s to register at its start, which four more
processes importing Lightning at the same moment on a loaded machine have made it miss). Each of these three is
killed 3 s after its round-2 checkpoint is written (round 3's first stage of client 0 has then begun, inside
Lightning, and stalls) and resumed at once.
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
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("flower_simulation")]

# 3 clients, one per class group: every step type of every algorithm crosses the wire at a third less work than
# the config's 6 (the deployment test runs 3 clients too)
CLIENTS = 3
PROTOCOLS = ("COSMOS", "FedMD")  # rounds 0..2, against an in-process run
# algorithm -> the stage its round starts with (where the stall that stops the run in round 3 is planted)
FIRST_STAGE = {"fedselect": "selective training", "pfedck": "mutual distillation", "pfedhn": "inner steps"}
SETTINGS = {"fedselect": "--algorithm.every 1", "pfedck": "--algorithm.num_clusters 2", "pfedhn": ""}
COMMON = "--rounds 3 --clients.backbones [test_efficientnet]"
KILL_AFTER_S = 3  # after the round-2 checkpoint is written


def _every_core() -> None:
    # a pytest-xdist worker is pinned to one core (conftest.py); Ray sizes its pool of virtual nodes by the cores
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, range(os.cpu_count() or 1))


def _more(algorithm):
    return f"{COMMON} {SETTINGS[algorithm]}".strip() if algorithm in FIRST_STAGE else ""


def _fit_argv(algorithm, run_dir):
    return ["fit", "--config", "configs/digits_flower.yaml", "--algorithm", algorithm, "--run_dir", str(run_dir),
            "--data.num_clients", str(CLIENTS), *_more(algorithm).split()]


def _start(argv, cwd, log, env=None):
    return subprocess.Popen(argv, cwd=cwd, stdout=open(log, "w"), stderr=subprocess.STDOUT, preexec_fn=_every_core,
                            env=env)


def _status(proc, deadline):
    """``proc``'s exit status, or None if it was still running at ``deadline`` (then it is killed)."""
    try:
        return proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        return None
    finally:
        proc.kill()


@pytest.fixture(scope="module")
def runs(repo_root, tmp_path_factory):
    """Every run of the module, side by side (module docstring). Returns ``{"tmp", "in_process", "flower",
    "killed"}``: the run directories ``{algorithm: run_dir}`` of the in-process runs (COSMOS and FedMD), of the
    simulation's runs (all five) and of the killed and resumed runs, with ``"status"``: each process's exit
    status (None: still running after PROCESS_TIMEOUT_S), ``"killed_status"`` and ``"resume_status"`` by
    algorithm, and ``"summary_at_kill"``: whether a killed run had written summary.json when it was killed."""
    tmp = tmp_path_factory.mktemp("flower_simulation")
    local = {a: tmp / f"in_process_{a}" for a in PROTOCOLS}
    flower = {a: tmp / f"flower_{a}" for a in (*PROTOCOLS, *FIRST_STAGE)}
    killed = {a: tmp / f"killed_{a}" for a in FIRST_STAGE}
    fits = "; ".join(f"assert main({_fit_argv(a, local[a])!r}) == 0" for a in PROTOCOLS)
    deadline = time.monotonic() + PROCESS_TIMEOUT_S
    nodes = tmp / "nodes"  # the virtual nodes' disks: a node writes its identity there when it is greeted
    procs = {"flower": _start([sys.executable, str(repo_root / "tests" / "flower_simulation.py"), str(nodes),
                               str(CLIENTS), *(f"{flower[a]}:{a}:{_more(a)}".rstrip(":") for a in flower)],
                              repo_root, tmp / "flower.log")}
    while not nodes.exists() and procs["flower"].poll() is None and time.monotonic() < deadline:
        time.sleep(0.5)
    procs["in_process"] = _start([sys.executable, "-c", f"from cosmos_pl.cli import main; {fits}"], repo_root,
                                 tmp / "in_process.log")
    stalls = {}
    for a in FIRST_STAGE:
        stall = json.dumps([{"round": 3, "client": 0, "step": FIRST_STAGE[a], "kind": "hang"}])
        env = with_hooks({**os.environ, "COSMOS_PL_TEST_FAULTS": stall})
        stalls[a] = _start([sys.executable, "-m", "cosmos_pl.cli", *_fit_argv(a, killed[a])], repo_root,
                           tmp / f"killed_{a}.log", env)
    # each stalled run: SIGKILL KILL_AFTER_S after its round-2 checkpoint, then resumed at once, without the fault
    plain = {k: v for k, v in os.environ.items() if k != "COSMOS_PL_TEST_FAULTS"}
    checkpointed, killed_status, summary_at_kill, resumed = {}, {}, {}, {}
    try:
        while len(killed_status) < len(FIRST_STAGE) and time.monotonic() < deadline:
            for a, proc in stalls.items():
                if a in killed_status:
                    continue
                if a not in checkpointed and (killed[a] / "checkpoints" / "round-0002.pt").exists():
                    checkpointed[a] = time.monotonic()
                if proc.poll() is not None:  # it ended before it was killed: the test of `a` reports it
                    killed_status[a] = proc.returncode
                elif a in checkpointed and time.monotonic() - checkpointed[a] >= KILL_AFTER_S:
                    proc.send_signal(signal.SIGKILL)
                    killed_status[a] = proc.wait(timeout=60)
                    summary_at_kill[a] = (killed[a] / "summary.json").exists()
                    resumed[a] = _start([sys.executable, "-m", "cosmos_pl.cli", "fit", "--resume", str(killed[a])],
                                        repo_root, tmp / f"killed_{a}.resume.log", plain)
            time.sleep(0.05)
        status = {name: _status(proc, deadline) for name, proc in procs.items()}
        resume_status = {a: _status(proc, deadline) for a, proc in resumed.items()}
    finally:
        for proc in [*procs.values(), *stalls.values(), *resumed.values()]:
            proc.kill()
    return {"tmp": tmp, "in_process": local, "flower": flower, "killed": killed, "status": status,
            "killed_status": killed_status, "summary_at_kill": summary_at_kill, "resume_status": resume_status}


def _log(runs, name):
    return (runs["tmp"] / f"{name}.log").read_text()[-5000:]


def _flower_finished(runs, algorithm):
    assert runs["status"]["flower"] == 0, _log(runs, "flower")
    assert (runs["flower"][algorithm] / "summary.json").is_file(), (algorithm, _log(runs, "flower"))


def _same_records(a, b, what):
    for name in ("metrics.csv", "clients.csv"):
        assert (a / name).read_text() == (b / name).read_text(), (what, name)


def test_simulation_metrics_equal_the_in_process_run(runs):
    assert runs["status"]["in_process"] == 0, _log(runs, "in_process")
    for a in PROTOCOLS:
        _flower_finished(runs, a)
        flower = runs["flower"][a]
        _same_records(flower, runs["in_process"][a], f"{a}: the simulation's records against the in-process run's")
        metrics = list(csv.DictReader((flower / "metrics.csv").open()))
        assert [r["round"] for r in metrics] == ["0", "1", "2"] and all(r["failed_clients"] == "0" for r in metrics)
        traffic = list(csv.DictReader((flower / "traffic.csv").open()))
        for r in metrics[1:]:
            # |U| = 269 public digits x M = 10 classes x 4 bytes (float32), from every client in every round
            uploads = [int(t["received_bytes"]) for t in traffic if t["round"] == r["round"] and
                       t["message"] == "query.pseudo_labels"]
            assert uploads == [269 * 10 * 4] * CLIENTS == [int(r["upload_bytes_per_client"])] * CLIENTS, a


@pytest.mark.parametrize("algorithm", sorted(FIRST_STAGE))
def test_flower_simulation_gives_the_in_process_records(runs, algorithm):
    _flower_finished(runs, algorithm)
    flower = runs["flower"][algorithm]
    metrics = list(csv.DictReader((flower / "metrics.csv").open()))
    assert [r["round"] for r in metrics] == ["0", "1", "2", "3"] and all(r["failed_clients"] == "0" for r in metrics)
    traffic = list(csv.DictReader((flower / "traffic.csv").open()))
    for r in metrics[1:]:  # every client sent its weights and loaded the server's, every round
        for message in ("query.weights", "train.load_weights"):
            assert sum(t["round"] == r["round"] and t["message"] == message for t in traffic) == CLIENTS, message
    # the in-process records: rounds 0..2 of the killed run, written before it was killed (round 3: the next test)
    assert runs["resume_status"].get(algorithm) == 0, _log(runs, f"killed_{algorithm}.resume")
    _same_records(flower, runs["killed"][algorithm],
                  f"{algorithm}: the simulation's records against the in-process run's (rounds 0..2 uninterrupted, "
                  "round 3 resumed after SIGKILL)")


@pytest.mark.parametrize("algorithm", sorted(FIRST_STAGE))
def test_sigkill_in_round_3_then_resume_gives_the_uninterrupted_records(runs, algorithm):
    assert runs["killed_status"].get(algorithm) == -signal.SIGKILL, _log(runs, f"killed_{algorithm}")
    assert runs["summary_at_kill"][algorithm] is False
    assert runs["resume_status"][algorithm] == 0, _log(runs, f"killed_{algorithm}.resume")
    # the uninterrupted run: the simulation's (the test above ties its rounds 0..2 to the in-process run's)
    _flower_finished(runs, algorithm)
    _same_records(runs["killed"][algorithm], runs["flower"][algorithm],
                  f"{algorithm}: the resumed run's records against the uninterrupted run's (the simulation's)")

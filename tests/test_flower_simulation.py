"""Flower's simulation engine gives the in-process run's numbers.

The same config (digits, 3 clients in 3 class groups, 2 rounds, one torch thread per client) runs with ``cosmos-pl fit``
and on Flower's simulation engine (3 virtual SuperNodes, Ray), for COSMOS and FedMD. Every client step runs the same code with the
same seeds on either transport, and only pseudo-labels and targets cross the wire, so metrics.csv and clients.csv
must be identical byte for byte; traffic.csv must show every upload's bytes as metrics.csv counts them.
"""

import csv
import os
import subprocess
import sys

import pytest

from conftest import PROCESS_TIMEOUT_S

pytest.importorskip("flwr", reason="the [flower] extra is not installed (make test installs it)")

pytestmark = pytest.mark.slow  # subprocess runs, or a Flower federation

ALGORITHMS = ("COSMOS", "FedMD")
# 3 clients, one per class group: every step type of both algorithms crosses the wire at a third less work than the
# config's 6 (the deployment test runs 3 clients too)
CLIENTS = 3


def _every_core() -> None:
    # a pytest-xdist worker is pinned to one core (conftest.py); Ray sizes its pool of virtual nodes by the cores
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, range(os.cpu_count() or 1))


def _start(argv, cwd, log):
    return subprocess.Popen(argv, cwd=cwd, stdout=open(log, "w"), stderr=subprocess.STDOUT, preexec_fn=_every_core)


def _finish(proc, log):
    try:
        assert proc.wait(timeout=PROCESS_TIMEOUT_S) == 0, log.read_text()[-5000:]
    finally:
        proc.kill()


def test_simulation_metrics_equal_the_in_process_run(repo_root, tmp_path):
    local = {a: tmp_path / f"in_process_{a}" for a in ALGORITHMS}
    flower = {a: tmp_path / f"flower_{a}" for a in ALGORITHMS}
    fits = "; ".join(f"assert main(['fit', '--config', 'configs/digits_flower.yaml', '--algorithm', '{a}', "
                     f"'--run_dir', '{local[a]}', '--data.num_clients', '{CLIENTS}']) == 0" for a in ALGORITHMS)
    # side by side (one torch thread each: the numbers do not depend on what else runs)
    logs = tmp_path / "in_process.log", tmp_path / "flower.log"
    in_process = _start([sys.executable, "-c", f"from cosmos_pl.cli import main; {fits}"], repo_root, logs[0])
    simulation = _start([sys.executable, str(repo_root / "tests" / "flower_simulation.py"), str(tmp_path / "nodes"),
                         str(CLIENTS), *(f"{flower[a]}:{a}" for a in ALGORITHMS)], repo_root, logs[1])
    _finish(in_process, logs[0])
    _finish(simulation, logs[1])

    for a in ALGORITHMS:
        assert (flower[a] / "summary.json").is_file(), (a, (tmp_path / "flower.log").read_text()[-5000:])
        for name in ("metrics.csv", "clients.csv"):
            assert (flower[a] / name).read_text() == (local[a] / name).read_text(), (a, name)
        metrics = list(csv.DictReader((flower[a] / "metrics.csv").open()))
        assert [r["round"] for r in metrics] == ["0", "1", "2"] and all(r["failed_clients"] == "0" for r in metrics)
        traffic = list(csv.DictReader((flower[a] / "traffic.csv").open()))
        for r in metrics[1:]:
            # |U| = 269 public digits x M = 10 classes x 4 bytes (float32), from every client in every round
            uploads = [int(t["received_bytes"]) for t in traffic if t["round"] == r["round"] and
                       t["message"] == "query.pseudo_labels"]
            assert uploads == [269 * 10 * 4] * CLIENTS == [int(r["upload_bytes_per_client"])] * CLIENTS, a

"""Flower's simulation engine gives the in-process run's numbers (issue 10, must-show 1).

The same config (digits, 6 clients, 2 rounds, one torch thread per client) runs once with ``cosmos-pl fit`` and once
on Flower's simulation engine (6 virtual SuperNodes, Ray), for COSMOS and FedMD. Every client step runs the same code
with the same seeds on either transport, and only pseudo-labels and targets cross the wire, so metrics.csv and
clients.csv must be identical byte for byte; traffic.csv must show every upload's bytes as metrics.csv counts them.
"""

import csv
import os
import subprocess
import sys

import pytest

pytest.importorskip("flwr", reason="the [flower] extra is not installed (make test installs it)")


def _every_core() -> None:
    # a pytest-xdist worker is pinned to one core (conftest.py); Ray sizes its pool of virtual nodes by the cores
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, range(os.cpu_count() or 1))


def _run(argv, cwd, log):
    with open(log, "w") as out:
        done = subprocess.run(argv, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, timeout=600,
                              preexec_fn=_every_core)
    assert done.returncode == 0, log.read_text()[-5000:]


@pytest.mark.parametrize("algorithm", ["COSMOS", "FedMD"])
def test_simulation_metrics_equal_the_in_process_run(repo_root, tmp_path, algorithm):
    flags = ["--algorithm", algorithm]
    local, flower = tmp_path / "in_process", tmp_path / "flower"
    _run([sys.executable, "-m", "cosmos_pl.cli", "fit", "--config", "configs/digits_flower.yaml", "--run_dir",
          str(local), *flags], repo_root, tmp_path / "in_process.log")
    _run([sys.executable, str(repo_root / "tests" / "flower_simulation.py"), str(flower), str(tmp_path / "nodes"),
          *flags], repo_root, tmp_path / "flower.log")
    assert (flower / "summary.json").is_file(), (tmp_path / "flower.log").read_text()[-5000:]

    for name in ("metrics.csv", "clients.csv"):
        assert (flower / name).read_text() == (local / name).read_text(), name
    metrics = list(csv.DictReader((flower / "metrics.csv").open()))
    assert [r["round"] for r in metrics] == ["0", "1", "2"] and all(r["failed_clients"] == "0" for r in metrics)

    traffic = list(csv.DictReader((flower / "traffic.csv").open()))
    for r in metrics[1:]:
        # |U| = 269 public digits x M = 10 classes x 4 bytes (float32), from every client in every round
        uploads = [int(t["received_bytes"]) for t in traffic if t["round"] == r["round"] and
                   t["message"] == "query.pseudo_labels"]
        assert uploads == [269 * 10 * 4] * 6 == [int(r["upload_bytes_per_client"])] * 6

"""A real Flower deployment on localhost: a SuperLink and 3 SuperNodes as subprocesses, COSMOS submitted with
``cosmos-pl flower-run`` (``flwr run`` that exits non-zero unless the run completed).

One federation shows four things:
- a run whose ServerApp fails (an empty ``config``, submitted alongside) makes the command exit 2 with one line naming
  the run, its status and the ServerApp's error, where ``flwr run`` exits 0; the COSMOS run completes and exits 0;
- the run finishes 2 rounds over the nodes, and the pseudo-label bytes the server received from each client in each
  round (``traffic.csv``, counted from the arrays that arrived) equal ``metrics.csv`` / ``summary.json``'s accounting;
- SuperNode 2 is killed (SIGKILL) in round 1 right after its upload: the server finishes round 1 with the others and
  records client 2's failure; the node, restarted with the same command, rejoins in round 2 with the model it
  committed after round 0 (the digest it reported then), and round 2 has all 3 clients.
"""

import csv
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("flwr", reason="the [flower] extra is not installed (make test installs it)")

pytestmark = pytest.mark.slow  # subprocess runs, or a Flower federation

BIN = Path(sys.executable).parent
CLIENTS = 3


def _every_core() -> None:
    # a pytest-xdist worker is pinned to one core (conftest.py); 5 processes (SuperLink, ServerApp, 3 nodes each
    # starting a ClientApp per message) may use every core
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, range(os.cpu_count() or 1))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Processes:
    """Every process in its own session, so a kill takes its children (Flower's per-message ClientApps) along."""

    def __init__(self, logs: Path, env: dict) -> None:
        self.logs, self.env, self.procs = logs, env, {}

    def start(self, name: str, argv: list[str], cwd: Path) -> subprocess.Popen:
        log = open(self.logs / f"{name}.log", "a")
        proc = subprocess.Popen(argv, cwd=cwd, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, preexec_fn=_every_core)
        self.procs[name] = proc
        return proc

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        try:
            os.killpg(self.procs[name].pid, sig)
        except ProcessLookupError:
            pass
        self.procs[name].wait(timeout=30)

    def stop_all(self) -> None:
        for proc in self.procs.values():
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 10
        for proc in self.procs.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _wait(predicate, timeout: float, what: str, logs: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    tails = "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(logs.glob("*.log")))
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}\n{tails}")


def _rows(path: Path) -> list[dict]:
    return list(csv.DictReader(path.open())) if path.is_file() else []


def _healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1):
            return True
    except OSError:
        return False


def test_superlink_and_three_supernodes_run_cosmos_and_survive_a_killed_node(repo_root, tmp_path):
    start = time.monotonic()
    logs, run_dir, home = tmp_path / "logs", tmp_path / "run", tmp_path / "flwr_home"
    logs.mkdir()
    home.mkdir()
    link = _free_port()
    (home / "config.toml").write_text(f'[superlink]\ndefault = "local-deployment"\n\n[superlink.local-deployment]\n'
                                      f'address = "127.0.0.1:{link}"\ninsecure = true\n')
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "FLWR_HOME": str(home),
           "FLWR_TELEMETRY_ENABLED": "0", "FLWR_DISABLE_UPDATE_CHECK": "1", "NO_COLOR": "1"}
    procs = _Processes(logs, env)

    def supernode(i: int, port: int) -> None:
        procs.start(f"supernode_{i}", [str(BIN / "flower-supernode"), "--insecure", "--superlink", f"127.0.0.1:{link}",
                                       "--port", str(port), "--node-config",
                                       f'partition-id={i} state-dir="{tmp_path / f"node_{i}"}"'], tmp_path)

    try:
        procs.start("superlink", [str(BIN / "flower-superlink"), "--insecure", "--host", "127.0.0.1", "--port",
                                  str(link), "--disable-runtime-dependency-installation"], tmp_path)
        _wait(lambda: _healthy(link), 60, "the SuperLink", logs)
        ports = [_free_port() for _ in range(CLIENTS)]
        for i in range(CLIENTS):
            supernode(i, ports[i])
        # a run that fails in its ServerApp, before any node is asked: it ends while the nodes start
        wrapper = [sys.executable, "-m", "cosmos_pl.cli", "flower-run", str(repo_root), "local-deployment"]
        failing = procs.start("failing_run", [*wrapper, "--run-config", "config=''"], tmp_path)
        run_config = (f"config='configs/digits_flower.yaml' run-dir='{run_dir}' "
                      f"args='--data.num_clients {CLIENTS}' reply-timeout=240 join-timeout=240")
        flwr = procs.start("flwr_run", [*wrapper, "--stream", "--run-config", run_config], tmp_path)

        # round 1: once client 2's pseudo-labels have arrived, kill its SuperNode (and the ClientApp it started)
        def uploaded() -> bool:
            return any(r["round"] == "1" and r["client"] == "2" and r["message"] == "query.pseudo_labels"
                       for r in _rows(run_dir / "traffic.csv"))

        _wait(uploaded, 400, "client 2's round-1 upload", logs)
        procs.kill("supernode_2")
        killed_at = time.monotonic() - start
        supernode(2, ports[2])  # the same command: a new node id, an empty node state, the same state-dir

        _wait(lambda: flwr.poll() is not None, 500, "flwr run to end", logs)
        _wait(lambda: (run_dir / "summary.json").is_file(), 30, "summary.json", logs)
        _wait(lambda: failing.poll() is not None, 60, "the failing run's command to end", logs)
    finally:
        procs.stop_all()
    wall = time.monotonic() - start
    print(f"deployment test: node 2 killed at {killed_at:.0f} s, run finished at {wall:.0f} s")

    # exit status and the one line: 2 for the run whose ServerApp failed, 0 for the one that completed
    failed_log = (logs / "failing_run.log").read_text()
    assert failing.returncode == 2, failed_log
    errors = [line for line in failed_log.splitlines() if line.startswith("cosmos-pl: error:")]
    assert len(errors) == 1 and re.fullmatch(
        r"cosmos-pl: error: the Flower run (\d+) ended finished:failed; ServerApp failed with exception: run config "
        r"'config' is empty: give a YAML config, e\.g\. flwr run \. --run-config "
        r"\"config='configs/digits_flower\.yaml'\" \(its log: flwr log \1 local-deployment\)", errors[0]), errors
    ok_log = (logs / "flwr_run.log").read_text()
    assert flwr.returncode == 0 and re.search(r"^cosmos-pl: the Flower run \d+ ended finished:completed$", ok_log,
                                              re.M), ok_log[-3000:]

    summary = json.loads((run_dir / "summary.json").read_text())
    metrics = {int(r["round"]): r for r in _rows(run_dir / "metrics.csv")}
    traffic = _rows(run_dir / "traffic.csv")
    clients = _rows(run_dir / "clients.csv")
    assert sorted(metrics) == [0, 1, 2] and summary["num_clients"] == CLIENTS

    # bytes: what arrived, counted from the received arrays, is what summary.json accounts for (|U| x M x 4 bytes)
    n, m = summary["communication"]["public_samples"], summary["communication"]["num_classes"]
    per_upload = n * m * 4
    assert summary["communication"]["upload_bytes_per_client_per_round"] == per_upload
    for rnd in (1, 2):
        assert int(metrics[rnd]["upload_bytes_per_client"]) == per_upload
        uploads = {int(r["client"]): int(r["received_bytes"]) for r in traffic
                   if r["round"] == str(rnd) and r["message"] == "query.pseudo_labels" and r["ok"] == "True"}
        assert uploads == {c: per_upload for c in range(CLIENTS)}, (rnd, uploads)
        # the teacher's pseudo-labels went out with the message that carried each client's distillation
        downloads = [int(r["sent_bytes"]) for r in traffic if r["round"] == str(rnd) and
                     "client distillation" in r["stages"].split("+")]
        assert len(downloads) == CLIENTS and set(downloads) == {int(metrics[rnd]["download_bytes_per_client"])}

    # the killed node: client 2 failed round 1, the others did not; round 2 has every client again
    failures = [(f["round"], f["client"]) for f in summary["failures"]]
    assert (1, 2) in failures and all(c == 2 and r == 1 for r, c in failures), failures
    assert int(metrics[1]["failed_clients"]) == 1 and int(metrics[2]["failed_clients"]) == 0
    round2 = [r for r in clients if r["round"] == "2"]
    assert len(round2) == CLIENTS and all(r["failed_step"] == "" for r in round2)

    # it rejoined in round 2 under a new node id with the model it committed after round 0, as it reported then
    joins = json.loads((run_dir / "nodes.json").read_text())["joins"]
    first = next(j for j in joins if j["client"] == 2 and j["round"] == 0)
    rejoin = [j for j in joins if j["client"] == 2 and j["round"] == 2]
    assert len(rejoin) == 1 and rejoin[0]["node_id"] != first["node_id"]
    assert rejoin[0]["committed_round"] == 0 and rejoin[0]["intact"] is True
    assert rejoin[0]["last_reported"] == [0, rejoin[0]["digest"]]

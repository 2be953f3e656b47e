"""A real deployment on localhost, as README's "Deployment" section runs it on real machines: TLS, SuperNode
authentication, each site given only its own folder; a SuperLink and the SuperNodes as subprocesses, COSMOS
submitted with ``cosmos-pl flower-run``.

One federation shows:
- ``cosmos-pl export-partition`` wrote digits for 3 clients into 3 folders and U into ``public.npz``; each registered
  SuperNode reads only its own folder (node config ``data``); the ServerApp is given U and the class list
  (``public=...``), and its process never opens a file of a site (every path it opens is listed by an audit hook);
- 2 rounds of COSMOS finish; every client's accuracies equal an in-process run over the same folders in which client
  2 fails its round-1 distillation (as the killed node below does), but for client 2 in round 1, whose node was down
  when the round ended (no score: undefined, not 0); the teachers' accuracies come from the nodes, and the evaluation
  bytes per client and round are the teacher's float tensors' bytes, the protocol's bytes pseudo-labels only;
- a SuperNode whose key is not registered never joins; a registered one claiming a client id another node holds is
  refused (``nodes.json``); SuperNode 2, killed (SIGKILL) in round 1 after its upload and restarted with the same
  command, rejoins in round 2 with the model it committed after round 0;
- a run whose ServerApp fails (an empty ``config``) makes ``cosmos-pl flower-run`` exit 2 with one line.
"""

import csv
import json
import os
import re
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("flwr", reason="the [flower] extra is not installed (make test installs it)")

from cosmos_pl.cli import main  # noqa: E402

pytestmark = pytest.mark.slow  # subprocess runs, or a Flower federation

BIN = Path(sys.executable).parent
CLIENTS = 3
README = Path(__file__).resolve().parents[1] / "README.md"

# README's two-machine commands, as this test runs them (A = 127.0.0.1:<port>, paths under the test's folder)
SUPERLINK = ("flower-superlink --host {host} --port {port} --ssl-ca-certfile {keys}/ca.crt --ssl-certfile "
             "{keys}/server.pem --ssl-keyfile {keys}/server.key --enable-supernode-auth "
             "--disable-runtime-dependency-installation")
REGISTER = "flwr supernode register {keys}/node_{i}.pub cosmos"
SUPERNODE = ("flower-supernode --superlink {host}:{port} --root-certificates {keys}/ca.crt "
             "--auth-supernode-private-key {keys}/node_{i} --node-config \"partition-id={i} data='{sites}/client_{i}' "
             "state-dir='{state}'\"")
SUBMIT = ("cosmos-pl flower-run . cosmos --stream --run-config \"config='configs/digits_flower.yaml' "
          "public='{sites}/public.npz' run-dir='{run}' rejoin-timeout=120 args='--data.num_clients 3'\"")
DRILL = [{"round": 1, "client": 2, "step": "client distillation", "kind": "raise"}]


def _every_core() -> None:
    # a pytest-xdist worker is pinned to one core (conftest.py); the SuperLink, the ServerApp and the nodes (each
    # starting a ClientApp per message) may use every core
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, range(os.cpu_count() or 1))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _argv(template: str, **fields) -> list[str]:
    import shlex

    argv = shlex.split(template.format(**fields))
    if argv[0] == "cosmos-pl":
        return [sys.executable, "-m", "cosmos_pl.cli", *argv[1:]]
    return [str(BIN / argv[0]), *argv[1:]]


class _Processes:
    """Every process in its own session, so a kill takes its children (Flower's per-message ClientApps) along."""

    def __init__(self, logs: Path, env: dict) -> None:
        self.logs, self.env, self.procs = logs, env, {}

    def start(self, name: str, argv: list[str], cwd: Path, env: dict | None = None) -> subprocess.Popen:
        log = open(self.logs / f"{name}.log", "a")
        proc = subprocess.Popen(argv, cwd=cwd, env={**self.env, **(env or {})}, stdout=log, stderr=subprocess.STDOUT,
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


def _healthy(port: int, ca: Path) -> bool:
    try:
        with urllib.request.urlopen(f"https://127.0.0.1:{port}/health", timeout=1,
                                    context=ssl.create_default_context(cafile=str(ca))):
            return True
    except OSError:
        return False


def test_readme_gives_the_commands_this_test_runs():
    text = README.read_text()
    for template in (SUPERLINK, REGISTER, SUPERNODE, SUBMIT):
        shown = template.format(host="A", port="9091", keys="keys", i="0", sites="sites", state="/var/lib/cosmos-pl",
                                run="runs/digits-sites")
        assert shown in text, shown


@pytest.mark.slow
def test_tls_deployment_of_sites_with_their_own_data(repo_root, tmp_path):
    start = time.monotonic()
    logs, run_dir, home, keys, sites = (tmp_path / n for n in ("logs", "run", "flwr_home", "keys", "sites"))
    logs.mkdir()
    home.mkdir()
    assert main(["export-partition", "--config", str(repo_root / "configs/digits_flower.yaml"), "--data.num_clients",
                 str(CLIENTS), "--out", str(sites)]) == 0
    assert main(["flower-keys", "--out", str(keys), "--host", "127.0.0.1", "--nodes", "5"]) == 0
    link = _free_port()
    (home / "config.toml").write_text(f'[superlink]\ndefault = "cosmos"\n\n[superlink.cosmos]\n'
                                      f'address = "127.0.0.1:{link}"\nroot-certificates = "{keys}/ca.crt"\n')
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "FLWR_HOME": str(home),
           "FLWR_TELEMETRY_ENABLED": "0", "FLWR_DISABLE_UPDATE_CHECK": "1", "NO_COLOR": "1"}
    env.pop("COSMOS_PL_TEST_FAULTS", None)
    procs = _Processes(logs, env)
    audit = tmp_path / "server_opens.txt"
    fields = dict(host="127.0.0.1", port=link, keys=keys, sites=sites, run=run_dir)

    runtime_ports: dict[str, int] = {}

    def supernode(name: str, i: int, state: Path, partition: int | None = None) -> None:
        # README's command, plus the one flag several nodes on one machine need: each its own port for the Runtime
        # HTTP API its ClientApps talk to (9094 by default); a restarted node gets its port again
        port = runtime_ports.setdefault(name, _free_port())
        argv = [*_argv(SUPERNODE, **fields, i=i, state=state), "--port", str(port)]
        if partition is not None:  # the impostor: another node's key, a client id it does not hold
            argv = [a.replace(f"partition-id={i}", f"partition-id={partition}").replace(
                f"client_{i}'", f"client_{partition}'") for a in argv]
        procs.start(name, argv, tmp_path)

    try:
        procs.start("superlink", _argv(SUPERLINK, **fields), tmp_path, {"COSMOS_PL_AUDIT_OPENS": str(audit)})
        _wait(lambda: _healthy(link, keys / "ca.crt"), 60, "the SuperLink", logs)
        # node_3 is registered too: the impostor below; node_4 never is. The registrations run side by side.
        registering = [subprocess.Popen(_argv(REGISTER, **fields, i=i), cwd=repo_root, env=env, text=True,
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for i in range(CLIENTS + 1)]
        for registered in registering:
            out, _ = registered.communicate(timeout=120)
            assert registered.returncode == 0, out
        for i in range(CLIENTS):
            supernode(f"supernode_{i}", i, tmp_path / f"node_{i}")
        supernode("unregistered", 4, tmp_path / "node_unregistered", partition=1)
        # a run that fails in its ServerApp, before any node is asked: it ends while the nodes start
        failing = procs.start("failing_run", [sys.executable, "-m", "cosmos_pl.cli", "flower-run", str(repo_root),
                                              "cosmos", "--run-config", "config=''"], tmp_path)
        flwr = procs.start("flwr_run", _argv(SUBMIT, **fields), repo_root)

        def uploaded(rnd: int, client: int) -> bool:
            return any(r["round"] == str(rnd) and r["client"] == str(client) and r["message"] == "query.pseudo_labels"
                       for r in _rows(run_dir / "traffic.csv"))

        # round 1: once client 2's pseudo-labels have arrived, kill its SuperNode (and the ClientApp it started), and
        # bring in a registered node that claims client 0
        _wait(lambda: uploaded(1, 2), 600, "client 2's round-1 upload", logs)
        procs.kill("supernode_2")
        killed_at = time.monotonic() - start
        supernode("supernode_2", 2, tmp_path / "node_2")  # the same command: its key, its state-dir
        supernode("impostor", 3, tmp_path / "node_impostor", partition=0)

        # node 2's key is the killed node's: the SuperLink refuses it (the node exits) until it has marked the old
        # session offline (2 missed heartbeats of 30 s); a supervisor restarts it, and the server waits for it at
        # the start of round 2 (rejoin-timeout)
        def ended() -> bool:
            if procs.procs["supernode_2"].poll() is not None and flwr.poll() is None:
                time.sleep(2)
                supernode("supernode_2", 2, tmp_path / "node_2")
            return flwr.poll() is not None

        _wait(ended, 600, "the run to end", logs)
        _wait(lambda: failing.poll() is not None, 60, "the failing run's command to end", logs)
    finally:
        procs.stop_all()
    print(f"deployment test: node 2 killed at {killed_at:.0f} s, run finished at {time.monotonic() - start:.0f} s")

    ok_log = (logs / "flwr_run.log").read_text()
    assert flwr.returncode == 0 and re.search(r"^cosmos-pl: the Flower run \d+ ended finished:completed$", ok_log,
                                              re.M), ok_log[-3000:]
    failed_log = (logs / "failing_run.log").read_text()
    errors = [line for line in failed_log.splitlines() if line.startswith("cosmos-pl: error:")]
    assert failing.returncode == 2 and len(errors) == 1 and re.fullmatch(
        r"cosmos-pl: error: the Flower run (\d+) ended finished:failed; ServerApp failed with exception: run config "
        r"'config' is empty: give a YAML config, e\.g\. flwr run \. --run-config "
        r"\"config='configs/digits_flower\.yaml'\" \(its log: flwr log \1 cosmos\)", errors[0]), errors

    # the server never opened a file of a site: only U and the class list (public.npz)
    opened = audit.read_text().splitlines()
    assert any(p.endswith("public.npz") for p in opened)
    assert not [p for p in opened if "/client_" in p and str(sites) in p]

    # every client's numbers are those of the same federation in-process (client 2 failing its round-1 distillation)
    reference = tmp_path / "in_process"
    os.environ["COSMOS_PL_TEST_FAULTS"] = json.dumps(DRILL)
    try:
        assert main(["fit", "--config", str(repo_root / "configs/digits_flower.yaml"), "--data.num_clients",
                     str(CLIENTS), "--data.dataset", "cosmos_pl.data.SiteFolders", "--data.dataset.root", str(sites),
                     "--run_dir", str(reference), "--wandb.mode", "disabled"]) == 0
    finally:
        del os.environ["COSMOS_PL_TEST_FAULTS"]
    scores = ("teacher_acc", "client_acc")

    def by_client(path):
        return {(r["round"], r["client"]): tuple(r[k] for k in scores) for r in _rows(path / "clients.csv")}

    deployed, simulated = by_client(run_dir), by_client(reference)
    assert {k: v for k, v in deployed.items() if k != ("1", "2")} == \
        {k: v for k, v in simulated.items() if k != ("1", "2")}
    assert deployed[("1", "2")] == ("", "")  # its node was down at the end of round 1: no score
    metrics, expected = _rows(run_dir / "metrics.csv"), _rows(reference / "metrics.csv")
    assert [metrics[0], metrics[2]] == [expected[0], expected[2]]
    assert [r["failed_clients"] for r in metrics] == ["0", "1", "0"]

    # bytes: pseudo-labels only for the protocol; the teachers sent to be scored, apart
    summary = json.loads((run_dir / "summary.json").read_text())
    comm = summary["communication"]
    assert comm["upload_bytes_per_client_per_round"] == comm["public_samples"] * comm["num_classes"] * 4
    traffic = _rows(run_dir / "traffic.csv")
    teacher = [int(r["evaluation_bytes"]) for r in traffic if r["message"] == "evaluate.scores" and r["round"] != "0"
               and r["ok"] == "True"]
    assert teacher and len(set(teacher)) == 1 and comm["evaluation_bytes_per_client_per_round"] == teacher[0]

    # who joined: the registered sites; the impostor refused; the unregistered node never seen
    nodes = json.loads((run_dir / "nodes.json").read_text())
    assert sorted(int(c) for c in nodes["clients"]) == [0, 1, 2]
    assert any("client 0 was first held by another node" in f["reason"] for f in nodes["join_failures"])
    joined = {j["node_id"] for j in nodes["joins"]} | {f["node_id"] for f in nodes["join_failures"]}
    assert len(joined) == CLIENTS + 1  # 3 sites (node 2 back under its registered id) and the impostor
    rejoin = [j for j in nodes["joins"] if j["client"] == 2 and j["round"] == 2]
    assert len(rejoin) == 1 and rejoin[0]["committed_round"] == 0 and rejoin[0]["intact"] is True

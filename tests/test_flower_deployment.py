"""A real deployment on localhost, as docs/deployment.md runs it on real machines: TLS, SuperNode
authentication, each site with its own key and only its own folder, client ids bound to keys by the operator's
sites.toml; a SuperLink and the SuperNodes as subprocesses (cosmos_pl/flower/localhost.py, as `make deploy-demo`),
COSMOS submitted with ``cosmos-pl flower-run``. It audits both sides and tries the attacks a node can make.

One federation shows:
- ``cosmos-pl export-partition`` wrote digits for 3 clients into 3 folders; U went to the operator's folder; each
  site made its own key pair and only the .pub reached the operator, who registered it and named it in sites.toml
  (clients 0 and 1 by their .pub file, client 2 by the node id its registration gave);
- the ServerApp builds no client data set (it runs in a deployment's no-client-data guard, under which any such
  construction raises) and opens no file of any site nor the digits data set (an audit hook lists every path it
  opens); each SuperNode's processes open, of the site folders, only their own;
- 2 rounds of COSMOS finish; every client's accuracies equal an in-process run over a copy of the same export with
  the same faults (client 0 fails its round-1 distillation, as its killed node does; client 1's round-2 upload is
  NaN), but for client 0 in round 1, whose node was down when the round ended (no score). That run (``cosmos-pl
  fit``, one torch thread per client: its numbers do not depend on what else runs) starts with the deployment and
  runs beside it;
- attacks: a SuperNode whose key is not registered never joins (its own log says the SuperLink would not activate it); a
  registered node whose key is not the one named for client 0 claims client 0 while client 0's node is down and is
  refused; a registered node sending a malformed hello is refused; client 1's node sends a malformed upload (NaN) in
  round 2 and fails that round only; SuperNode 0, killed (SIGKILL) in round 1 after its upload and restarted with the
  same command, rejoins in round 2 with the model it committed after round 0; the run completes;
- a deployment submitted without ``public`` makes ``cosmos-pl flower-run`` exit 2 with one line naming it.

The audit, the nodes' faults and Flower's shortened waits are test hooks (tests/hooks), which its ``sitecustomize``
installs in every process the test starts. The wait (``tests/hooks/flower_timing.py``): SuperNode 0, the one
killed, heartbeats every 10 s, Flower's shortest (30 s in Flower), so the SuperLink marks it offline (which fails
its round-1 distillation and lets its restart in) about 20 s after its last heartbeat instead of 60 s. The
SuperLink's rules (a node is offline after 2 missed heartbeats; a key whose node is online is refused) and every
message are Flower's own.
"""

import csv
import json
import os
import re
import shutil
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("flwr", reason="the [flower] extra is not installed (make test installs it)")

from cosmos_pl.cli import main  # noqa: E402
from conftest import PROCESS_TIMEOUT_S  # noqa: E402
from cosmos_pl.flower.localhost import (REGISTER, SUBMIT, SUPERLINK, SUPERNODE, Processes, argv,  # noqa: E402
                                        flwr_home, free_port, healthy, register, wait_for)
from hooks_path import with_hooks  # noqa: E402

pytestmark = pytest.mark.slow  # subprocess runs, or a Flower federation

CLIENTS = 3
README = Path(__file__).resolve().parents[1] / "docs" / "deployment.md"
# client 0's node is killed after its round-1 upload (its distillation never runs); client 1's node corrupts its
# round-2 upload (a node-side test fault); the in-process reference gets the same faults
DRILL = [{"round": 1, "client": 0, "step": "client distillation", "kind": "raise"},
         {"round": 2, "client": 1, "step": "upload", "kind": "nan_values"}]
NODE_FAULTS = {1: [DRILL[1]], 5: [{"client": 1, "step": "hello", "kind": "malformed"}]}
# SuperNode 0's heartbeat interval (module docstring): Flower's minimum (the SuperLink refuses a shorter one)
HEARTBEAT_S = "10"


def _rows(path: Path) -> list[dict]:
    return list(csv.DictReader(path.open())) if path.is_file() else []


def test_readme_gives_the_commands_this_test_runs():
    # a command the page splits over lines with shell continuations (`\` at a line's end) is the same command
    text = re.sub(r"[ \t]*\\\n[ \t]*", " ", README.read_text())
    for template in (SUPERLINK, REGISTER, SUPERNODE, SUBMIT):
        shown = template.format(host="A", port="9091", keys="keys", i="0", state="state", ca="ca.crt",
                                key="keys/site_0", data="/srv/site_0", server="/srv/operator", run="runs/digits-sites",
                                clients=3)
        if template is SUPERNODE:
            shown = shown.replace("state-dir='state'", "state-dir='/var/lib/cosmos-pl'")
        assert shown in text, shown


def _opened_under(log: Path, root: Path) -> set[str]:
    return {p for p in log.read_text().splitlines() if p.startswith(str(root) + os.sep)} if log.is_file() else set()


@pytest.mark.slow
def test_tls_deployment_of_sites_with_their_own_data_and_keys(repo_root, tmp_path):
    start = time.monotonic()
    operator, sites, logs, run_dir = (tmp_path / n for n in ("operator", "sites", "logs", "run"))
    assert main(["export-partition", "--config", str(repo_root / "configs/digits_flower.yaml"), "--data.num_clients",
                 str(CLIENTS), "--out", str(sites)]) == 0
    # the in-process reference reads a copy of the export whole: U, and partition.json, what only a simulation knows
    reference_sites, reference = tmp_path / "reference_sites", tmp_path / "in_process"
    shutil.copytree(sites, reference_sites)
    (operator / "keys").mkdir(parents=True)
    shutil.move(str(sites / "public.npz"), operator / "public.npz")
    (sites / "partition.json").unlink()
    assert main(["flower-keys", "--out", str(operator / "keys"), "--host", "127.0.0.1", "--nodes", "0"]) == 0
    # sites 0..2 hold clients 0..2; site 3 is an impostor, site 4 never registered, site 5 sends a malformed hello
    for i in range(6):
        assert main(["flower-keys", "--site", f"site_{i}", "--out", str(tmp_path / f"site_{i}_keys")]) == 0
        shutil.copy(tmp_path / f"site_{i}_keys" / f"site_{i}.pub", operator / "keys")  # only the .pub travels
    elsewhere = tmp_path / "elsewhere"  # the hostile nodes' own (copied) data, outside the site folders
    shutil.copytree(sites / "client_0", elsewhere)
    link = free_port()
    # every process started gets the test hooks, each active only where its variable is set
    env = with_hooks(flwr_home(tmp_path / "flwr_home", link, operator / "keys" / "ca.crt"))
    procs = Processes(logs, env)
    server_audit = tmp_path / "server_opens.txt"
    runtime_ports: dict[str, int] = {}

    def supernode(name: str, site: int, partition: int, data: Path) -> None:
        # README's command, plus the one flag several nodes on one machine need: each its own port for the Runtime
        # HTTP API its ClientApps talk to (9094 by default); a restarted node gets its port again
        port = runtime_ports.setdefault(name, free_port())
        cmd = argv(SUPERNODE, host="127.0.0.1", port=link, ca=operator / "keys" / "ca.crt",
                   key=tmp_path / f"site_{site}_keys" / f"site_{site}", i=partition, data=data,
                   state=tmp_path / f"state_{name}")
        extra = {"COSMOS_PL_AUDIT_OPENS": str(tmp_path / f"{name}_opens.txt")}
        if site == 0:  # the node killed in round 1
            extra["COSMOS_PL_TEST_HEARTBEAT_S"] = HEARTBEAT_S
        if site in NODE_FAULTS:
            extra["COSMOS_PL_TEST_FAULTS"] = json.dumps(NODE_FAULTS[site])
        procs.start(name, [*cmd, "--port", str(port)], tmp_path, extra)

    try:
        in_process = procs.start("in_process", [
            sys.executable, "-m", "cosmos_pl.cli", "fit", "--config", str(repo_root / "configs/digits_flower.yaml"),
            "--data.num_clients", str(CLIENTS), "--data.dataset", "cosmos_pl.data.SiteFolders", "--data.dataset.root",
            str(reference_sites), "--run_dir", str(reference), "--wandb.mode", "disabled"], repo_root,
            {"COSMOS_PL_TEST_FAULTS": json.dumps(DRILL)})
        procs.start("superlink", argv(SUPERLINK, host="127.0.0.1", port=link, keys="keys", state="."), operator,
                    {"COSMOS_PL_AUDIT_OPENS": str(server_audit), "COSMOS_PL_TEST_SQLITE_BUSY_MS": "60000"})
        wait_for(lambda: healthy(link, operator / "keys" / "ca.crt"), 60, "the SuperLink", procs)
        node_ids = {i: register(operator / "keys", i, env, operator) for i in (0, 1, 2, 3, 5)}
        (operator / "sites.toml").write_text(f'[clients]\n0 = "keys/site_0.pub"\n1 = "keys/site_1.pub"\n'
                                             f'2 = {node_ids[2]}\n')
        for i in range(CLIENTS):
            supernode(f"supernode_{i}", i, i, sites / f"client_{i}")
        supernode("unregistered", 4, 1, elsewhere)
        supernode("malformed", 5, 1, elsewhere)
        # a deployment without U: refused in its ServerApp before any node is asked
        failing = procs.start("failing_run", [sys.executable, "-m", "cosmos_pl.cli", "flower-run", str(repo_root),
                                              "cosmos", "--run-config", "config='configs/digits_flower.yaml'"],
                              tmp_path)
        flwr = procs.start("flwr_run", argv(SUBMIT, server=operator, run=run_dir, clients=CLIENTS), repo_root)

        def while_running(predicate):
            # a predicate of the run's progress, which fails at once once the run has ended without it (instead of
            # waiting for PROCESS_TIMEOUT_S)
            def check() -> bool:
                ended = flwr.poll() is not None  # read first: what the run did before it ended is on disk by then
                if predicate():
                    return True
                assert not ended, f"the run ended before this point\n{procs.tails()}"
                return False

            return check

        def uploaded(rnd: int, client: int) -> bool:
            return any(r["round"] == str(rnd) and r["client"] == str(client) and r["message"] == "query.pseudo_labels"
                       for r in _rows(run_dir / "traffic.csv"))

        # round 1: once client 0's pseudo-labels have arrived, kill its SuperNode (and the ClientApp it started), and
        # bring in a registered node, not the one named for client 0, that claims client 0: the server greets it at
        # the start of round 2, while client 0 has no node (its node comes back only once the refusal is recorded)
        wait_for(while_running(lambda: uploaded(1, 0)), PROCESS_TIMEOUT_S, "client 0's round-1 upload", procs)
        procs.kill("supernode_0")
        killed_at = time.monotonic() - start
        supernode("impostor", 3, 0, elsewhere)

        def impostor_refused() -> bool:
            path = run_dir / "nodes.json"
            return path.is_file() and any(f["node_id"] == node_ids[3] for f in
                                          json.loads(path.read_text())["join_failures"])

        wait_for(while_running(impostor_refused), PROCESS_TIMEOUT_S, "the impostor's refusal", procs)
        assert "0" not in json.loads((run_dir / "nodes.json").read_text())["clients"]  # client 0's node is down
        supernode("supernode_0", 0, 0, sites / "client_0")  # the same command: its key, its state-dir

        # node 0's key is the killed node's: the SuperLink refuses it (the node exits) until it has marked the old
        # session offline (2 missed heartbeats, of HEARTBEAT_S here); a supervisor restarts it, and the server waits
        # for it at the start of round 2 (rejoin-timeout)
        def ended() -> bool:
            if procs.procs["supernode_0"].poll() is not None and flwr.poll() is None:
                time.sleep(2)
                supernode("supernode_0", 0, 0, sites / "client_0")
            return flwr.poll() is not None

        wait_for(ended, PROCESS_TIMEOUT_S, "the run to end", procs)
        wait_for(lambda: failing.poll() is not None, 60, "the failing run's command to end", procs)
        wait_for(lambda: in_process.poll() is not None, PROCESS_TIMEOUT_S, "the in-process reference run", procs)
    finally:
        procs.stop_all()
    print(f"deployment test: node 0 killed at {killed_at:.0f} s, run finished at {time.monotonic() - start:.0f} s")

    ok_log = (logs / "flwr_run.log").read_text()
    assert flwr.returncode == 0 and re.search(r"^cosmos-pl: the Flower run \d+ ended finished:completed$", ok_log,
                                              re.M), ok_log[-3000:]
    errors = [line for line in (logs / "failing_run.log").read_text().splitlines()
              if line.startswith("cosmos-pl: error:")]
    assert failing.returncode == 2 and len(errors) == 1 and re.fullmatch(
        r"cosmos-pl: error: the Flower run (\d+) ended finished:failed; ServerApp failed with exception: run config "
        r"'public' is empty, and this run is a deployment: .* \(its log: flwr log \1 cosmos\)", errors[0]), errors

    # the server side: U and sites.toml from the operator's folder; no file of any site, nor the digits data set
    opened = server_audit.read_text().splitlines()
    assert str(operator / "public.npz") in opened and str(operator / "sites.toml") in opened
    assert not [p for p in opened if p.startswith(str(sites)) or p.startswith(str(elsewhere))]
    assert not [p for p in opened if "digits.csv" in p]
    # each SuperNode's processes (its ClientApps) opened, of the site folders, only their own
    for i in range(CLIENTS):
        seen = _opened_under(tmp_path / f"supernode_{i}_opens.txt", sites)
        assert seen and all(p.startswith(str(sites / f"client_{i}") + os.sep) for p in seen), (i, sorted(seen)[:5])

    # every client's numbers are those of the same federation in-process, with the same faults
    assert in_process.returncode == 0, (logs / "in_process.log").read_text()[-3000:]
    scores = ("teacher_acc", "client_acc")

    def by_client(path):
        return {(r["round"], r["client"]): tuple(r[k] for k in scores) for r in _rows(path / "clients.csv")}

    deployed, simulated = by_client(run_dir), by_client(reference)
    assert {k: v for k, v in deployed.items() if k != ("1", "0")} == \
        {k: v for k, v in simulated.items() if k != ("1", "0")}
    assert deployed[("1", "0")] == ("", "")  # its node was down at the end of round 1: no score
    metrics, expected = _rows(run_dir / "metrics.csv"), _rows(reference / "metrics.csv")
    assert [metrics[0], metrics[2]] == [expected[0], expected[2]]
    assert [r["failed_clients"] for r in metrics] == ["0", "1", "1"]

    # bytes: pseudo-labels only for the protocol; the teachers sent to be scored, apart
    summary = json.loads((run_dir / "summary.json").read_text())
    comm = summary["communication"]
    assert comm["upload_bytes_per_client_per_round"] == comm["public_samples"] * comm["num_classes"] * 4
    traffic = _rows(run_dir / "traffic.csv")
    teacher = [int(r["evaluation_bytes"]) for r in traffic if r["message"] == "evaluate.scores" and r["round"] != "0"
               and r["ok"] == "True"]
    assert teacher and len(set(teacher)) == 1 and comm["evaluation_bytes_per_client_per_round"] == teacher[0]

    # who joined: the three sites, bound by key; every attack refused, with its reason, and the run went on
    nodes = json.loads((run_dir / "nodes.json").read_text())
    assert (nodes["mode"], nodes["bound_by"]) == ("deployment", "sites")
    assert nodes["clients"] == {"0": node_ids[0], "1": node_ids[1], "2": node_ids[2]}
    reasons = {}
    for f in nodes["join_failures"]:
        reasons.setdefault(f["node_id"], f["reason"])
    assert reasons[node_ids[3]] == (f"node {node_ids[3]}'s key is not the one sites.toml names for client 0: a "
                                    "client is held only by the key the operator named for it")
    assert reasons[node_ids[5]].startswith(f"hello from node {node_ids[5]} not accepted: field ")
    assert set(reasons) == {node_ids[3], node_ids[5]}  # the unregistered key never reached the server
    assert [f["round"] for f in nodes["join_failures"] if f["node_id"] == node_ids[3]] == [2]
    unregistered = (logs / "unregistered.log").read_text()
    assert "Failed to activate SuperNode." in unregistered, unregistered[-2000:]  # Flower's exit code 305
    rejoin = [j for j in nodes["joins"] if j["client"] == 0 and j["round"] == 2]
    assert len(rejoin) == 1 and rejoin[0]["committed_round"] == 0 and rejoin[0]["intact"] is True
    assert {j["client"]: j["bound_by"] for j in nodes["joins"]} == {0: "key", 1: "key", 2: "node id"}

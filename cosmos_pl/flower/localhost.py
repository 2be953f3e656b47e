"""A Flower deployment on this machine, as docs/deployment.md's recipe runs it on real ones: ``make deploy-demo``.

``python -m cosmos_pl.flower.localhost --out DIR`` (``make deploy-demo``) lays out one folder for the operator and
one per site, then starts, on 127.0.0.1:

- a SuperLink with TLS and SuperNode authentication (``--database``: its state, registered keys included, survives a
  restart), started from the operator's folder, which holds U (``public.npz``), ``sites.toml``, the CA and the
  SuperLink's certificate, and no path to any site folder;
- three SuperNodes, each given only its own folder (``cosmos-pl export-partition`` of the digits config, one folder
  per client) and its own key, which the site made itself (``cosmos-pl flower-keys --site``; only the ``.pub`` was
  copied to the operator, who registered it and named it for the site's client in ``sites.toml``);

then submits two rounds of COSMOS with ``cosmos-pl flower-run``, prints its final line and ``nodes.json``'s joins,
and stops every process it started (on success, failure or Ctrl-C). Exit status: ``cosmos-pl flower-run``'s.

:class:`Processes` and the command templates are also what ``tests/test_flower_deployment.py`` runs.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

__all__ = ["REGISTER", "SUBMIT", "SUPERLINK", "SUPERNODE", "Processes", "argv", "flwr_home", "free_port", "healthy",
           "main", "register", "wait_for"]

BIN = Path(sys.executable).parent
PROJECT = Path(__file__).resolve().parents[2]

# the documented commands (docs/deployment.md; A = the SuperLink's address); the test checks that the docs show
# them as written here
SUPERLINK = ("flower-superlink --host {host} --port {port} --ssl-ca-certfile {keys}/ca.crt --ssl-certfile "
             "{keys}/server.pem --ssl-keyfile {keys}/server.key --enable-supernode-auth --database {state}/state.db "
             "--disable-runtime-dependency-installation")
REGISTER = "flwr supernode register {keys}/site_{i}.pub cosmos --format json"
SUPERNODE = ("flower-supernode --superlink {host}:{port} --root-certificates {ca} --auth-supernode-private-key "
             "{key} --node-config \"partition-id={i} data='{data}' state-dir='{state}'\"")
SUBMIT = ("cosmos-pl flower-run . cosmos --stream --run-config \"config='configs/digits_flower.yaml' "
          "public='{server}/public.npz' sites='{server}/sites.toml' run-dir='{run}' rejoin-timeout=120 "
          "args='--data.num_clients {clients}'\"")


def argv(template: str, **fields: Any) -> list[str]:
    """A command template filled in, as the argv this Python's environment runs (``cosmos-pl`` as ``python -m``)."""
    args = shlex.split(template.format(**fields))
    if args[0] == "cosmos-pl":
        return [sys.executable, "-m", "cosmos_pl.cli", *args[1:]]
    return [str(BIN / args[0]), *args[1:]]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def healthy(port: int, ca: Path) -> bool:
    """Whether the SuperLink on 127.0.0.1:``port`` answers its health check over TLS (trusting ``ca``)."""
    try:
        with urllib.request.urlopen(f"https://127.0.0.1:{port}/health", timeout=1,
                                    context=ssl.create_default_context(cafile=str(ca))):
            return True
    except OSError:
        return False


def _every_core() -> None:
    # a pytest-xdist worker is pinned to one core: the SuperLink, the ServerApp and the nodes may use every core
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, range(os.cpu_count() or 1))


class Processes:
    """Every process in its own session, so that a kill takes its children (Flower's ServerApp and per-message
    ClientApps) along; each writes ``logs/<name>.log``."""

    def __init__(self, logs: Path, env: dict[str, str]) -> None:
        self.logs, self.env, self.procs = logs, env, {}
        logs.mkdir(parents=True, exist_ok=True)

    def start(self, name: str, args: list[str], cwd: Path, env: Optional[dict[str, str]] = None) -> subprocess.Popen:
        log = open(self.logs / f"{name}.log", "a")
        proc = subprocess.Popen(args, cwd=cwd, env={**self.env, **(env or {})}, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, preexec_fn=_every_core)
        log.close()  # the child holds its own copy
        self.procs[name] = proc
        return proc

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        try:
            os.killpg(self.procs[name].pid, sig)
        except ProcessLookupError:
            pass
        self.procs[name].wait(timeout=30)

    def stop_all(self) -> None:
        """SIGTERM to every process group, SIGKILL to what is left after 10 s."""
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
            proc.wait()

    def tails(self, chars: int = 3000) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text()[-chars:]}" for p in sorted(self.logs.glob("*.log")))


def wait_for(predicate: Callable[[], bool], timeout: float, what: str, procs: Processes) -> None:
    """Poll ``predicate`` until it holds.

    Raises:
        TimeoutError: after ``timeout`` seconds, with every log's tail.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise TimeoutError(f"timed out after {timeout:g} s waiting for {what}\n{procs.tails()}")


def flwr_home(home: Path, port: int, ca: Path) -> dict[str, str]:
    """A ``FLWR_HOME`` whose default SuperLink connection ``cosmos`` is 127.0.0.1:``port`` over TLS, and the
    environment that uses it (Flower's telemetry and update check off)."""
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.toml").write_text(f'[superlink]\ndefault = "cosmos"\n\n[superlink.cosmos]\n'
                                      f'address = "127.0.0.1:{port}"\nroot-certificates = "{ca}"\n')
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "FLWR_HOME": str(home),
           "FLWR_TELEMETRY_ENABLED": "0", "FLWR_DISABLE_UPDATE_CHECK": "1", "NO_COLOR": "1"}
    return env


def register(keys: Path, i: int, env: dict[str, str], cwd: Path) -> int:
    """``flwr supernode register`` of ``keys/site_<i>.pub`` (the documented command); returns the node id the
    SuperLink gave that key.

    Raises:
        RuntimeError: the registration failed (with flwr's output).
    """
    done = subprocess.run(argv(REGISTER, keys=keys, i=i), cwd=cwd, env=env, text=True, capture_output=True,
                          timeout=120)
    try:
        return int(json.loads(done.stdout[done.stdout.index("{"):])["node-id"])
    except (ValueError, KeyError, IndexError):
        raise RuntimeError(f"registering {keys}/site_{i}.pub failed (exit {done.returncode}): "
                           f"{done.stdout[-2000:]}{done.stderr[-2000:]}") from None


def _cli(*args: str) -> None:
    """``cosmos-pl <args>``, as a user runs it.

    Raises:
        RuntimeError: it exited non-zero."""
    status = subprocess.run([sys.executable, "-m", "cosmos_pl.cli", *args]).returncode
    if status != 0:
        raise RuntimeError(f"cosmos-pl {' '.join(args)} exited {status}")


def main(args: Optional[Sequence[str]] = None) -> int:
    """``make deploy-demo`` (module docstring); returns ``cosmos-pl flower-run``'s exit status."""
    p = argparse.ArgumentParser(prog="python -m cosmos_pl.flower.localhost", description=__doc__.splitlines()[0])
    p.add_argument("--out", default="runs/deploy-demo", help="the demo's folder (emptied first)")
    p.add_argument("--clients", type=int, default=3, help="sites, one SuperNode each")
    opts = p.parse_args(args)
    root = Path(opts.out).resolve()
    if root.exists():
        shutil.rmtree(root)
    server, export = root / "operator", root / "export"
    start = time.monotonic()
    # the operator: the CA and the SuperLink's certificate; U and the class list from the export; no site folder
    _cli("export-partition", "--config", str(PROJECT / "configs/digits_flower.yaml"), "--data.num_clients",
         str(opts.clients), "--out", str(export))
    _cli("flower-keys", "--out", str(server / "keys"), "--host", "127.0.0.1", "--nodes", "0")
    shutil.move(str(export / "public.npz"), server / "public.npz")
    for i in range(opts.clients):  # each site: its own data, and the key pair it makes itself
        site = root / f"site_{i}"
        shutil.move(str(export / f"client_{i}"), site / "data")
        _cli("flower-keys", "--site", f"site_{i}", "--out", str(site / "keys"))
        shutil.copy(site / "keys" / f"site_{i}.pub", server / "keys")  # only the public key travels
    shutil.rmtree(export)  # its partition.json is what only a simulation knows
    port = free_port()
    env = flwr_home(server / "flwr_home", port, server / "keys" / "ca.crt")
    procs = Processes(root / "logs", env)
    status = 1

    def stop(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        procs.start("superlink", argv(SUPERLINK, host="127.0.0.1", port=port, keys="keys", state="."), server)
        wait_for(lambda: healthy(port, server / "keys" / "ca.crt"), 60, "the SuperLink", procs)
        node_ids = [register(server / "keys", i, env, server) for i in range(opts.clients)]
        (server / "sites.toml").write_text(
            "# which SuperNode key holds which client: the .pub file each site sent\n[clients]\n"
            + "".join(f'{i} = "keys/site_{i}.pub"\n' for i in range(opts.clients)))
        print(f"cosmos-pl deploy-demo: SuperLink on 127.0.0.1:{port} (TLS, SuperNode authentication), "
              f"{opts.clients} site keys registered as nodes {', '.join(map(str, node_ids))}", flush=True)
        for i in range(opts.clients):
            site = root / f"site_{i}"
            procs.start(f"supernode_{i}", [*argv(SUPERNODE, host="127.0.0.1", port=port, ca=server / "keys/ca.crt",
                                                  key=site / "keys" / f"site_{i}", i=i, data=site / "data",
                                                  state=site / "state"), "--port", str(free_port())], site)
        run = root / "run"
        flwr = procs.start("flower_run", argv(SUBMIT, server=server, run=run, clients=opts.clients), PROJECT)
        wait_for(lambda: flwr.poll() is not None, 540, "the run to end", procs)
        status = flwr.returncode
        log = (root / "logs" / "flower_run.log").read_text().splitlines()
        first = next((k for k, line in enumerate(log) if line.startswith("final round")), None)
        last = next((k for k in range(first or 0, len(log)) if "Files in" in log[k]), first)
        print(" ".join(log[first:last + 1]) if first is not None else "")  # the run's final line
        print("\n".join(line for line in log if line.startswith("cosmos-pl: ") and "Flower run" in line))
        nodes = run / "nodes.json"
        if nodes.is_file():
            joined = json.loads(nodes.read_text())
            for j in joined["joins"]:
                print(f"  round {j['round']}: client {j['client']} joined on node {j['node_id']} (bound by "
                      f"{j['bound_by']})")
            for f in joined["join_failures"]:
                print(f"  round {f['round']}: node {f['node_id']} refused: {f['reason']}")
        print(f"cosmos-pl deploy-demo: exit {status} after {time.monotonic() - start:.0f} s; logs in "
              f"{root / 'logs'}, results in {run}")
    except KeyboardInterrupt:
        print("cosmos-pl deploy-demo: interrupted; stopping every process it started", flush=True)
        status = 130
    except Exception as err:  # noqa: BLE001 - report, then stop everything below
        print(f"cosmos-pl deploy-demo: error: {err}", flush=True)
        status = 1
    finally:
        procs.stop_all()
        signal.signal(signal.SIGTERM, previous)
    return status


if __name__ == "__main__":
    sys.exit(main())

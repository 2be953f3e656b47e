"""A one-node Slurm cluster for the tests: munge, MariaDB, slurmdbd, slurmctld and slurmd started in a folder of
their own (state, spool, logs, sockets), on free TCP ports, with Debian's packages (``tools/slurm_packages.sh``).

:class:`SlurmCluster` starts every daemon in the foreground with ``Popen`` (so each pid is known) and waits until
the node is idle; :meth:`SlurmCluster.stop` cancels every job of the cluster, waits for the queue to empty, stops
each daemon by its pid (SIGTERM, then SIGKILL) and kills whatever process is left that carries this cluster's
``SLURM_CONF`` (a job's ``slurmstepd`` or its processes). Where the cluster cannot be had (not root, a binary
missing, a daemon that does not come up) :meth:`SlurmCluster.start` raises :class:`Unavailable` with the reason
(the daemon's log tail), which the fixture turns into a skip.

Processes that talk to the cluster (sbatch, squeue, sacct, and every ``compare`` a test starts) need
:attr:`SlurmCluster.env`: ``SLURM_CONF`` pointing at its slurm.conf.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Optional

from cosmos_pl.flower.localhost import free_port  # stdlib only: no Flower needed

# the daemons' and commands' binaries (Debian's slurmctld, slurmd, slurm-client, slurmdbd, munge, mariadb-server)
BINARIES = ("munged", "mungekey", "mariadb-install-db", "mariadbd", "slurmdbd", "slurmctld", "slurmd", "sbatch",
            "squeue", "sacct", "sacctmgr", "scontrol", "scancel", "sinfo")
CLUSTER_NAME = "cosmostest"
PARTITION = "debug"


class Unavailable(Exception):
    """The cluster cannot be started here; the message says why."""


def _which(name: str) -> Optional[str]:
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/bin:/sbin:/bin")


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return f"(no log at {path})"


class SlurmCluster:
    """One node, one partition (``debug``, the default), accounting through slurmdbd into MariaDB."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.host = socket.gethostname().split(".")[0]
        # the machine's CPUs, as slurmd counts them (not this process's affinity: under pytest-xdist a worker is
        # pinned to its share of the cores, and one CPU would run every job one after another, leaving an array's
        # throttle nothing to hold back)
        self.cpus = os.cpu_count() or 1
        self.conf = self.root / "etc" / "slurm.conf"
        self.munge_socket = self.root / "munge" / "munge.socket"
        self.mysql_socket = self.root / "mysql" / "mysqld.sock"
        self.log_dir = self.root / "log"
        self.daemons: list[tuple[str, subprocess.Popen, Path]] = []  # (name, process, its log), in start order
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self.started_s: Optional[float] = None  # how long start() took

    # ------------------------------------------------------------------------------------------------ start
    def start(self) -> None:
        """Start every daemon and wait until the node is idle; raises Unavailable (after stopping what had started)
        where that cannot be done."""
        t0 = time.monotonic()
        if os.geteuid() != 0:
            raise Unavailable("the test Slurm cluster runs its daemons as root (SlurmUser=root); this user is not")
        missing = [b for b in BINARIES if not _which(b)]
        if missing:
            raise Unavailable(f"missing {', '.join(missing)}: run tools/slurm_packages.sh as root (make test does)")
        try:
            self._start_munge()
            self._start_mariadb()
            self._write_slurm_conf()
            self._start_slurmdbd()
            self._start_slurmctld()
            self._start_slurmd()
        except BaseException:
            self.stop()
            raise
        self.started_s = time.monotonic() - t0

    def _daemon(self, name: str, cmd: list[str], log: Path) -> subprocess.Popen:
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log.with_suffix(".out"), "ab") as out:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env=self.env, start_new_session=True)
        self.daemons.append((name, proc, log))
        return proc

    def _wait_for(self, name: str, ready, timeout_s: float = 60.0) -> None:
        """Until ``ready()`` is true; Unavailable with the daemon's log tail when it exits or times out."""
        _, proc, log = next(d for d in self.daemons if d[0] == name)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if ready():
                return
            if proc.poll() is not None:
                raise Unavailable(f"{name} exited with {proc.returncode}: {_tail(log)} "
                                  f"{_tail(log.with_suffix('.out'))}")
            time.sleep(0.2)
        raise Unavailable(f"{name} did not come up in {timeout_s:.0f} s: {_tail(log)} {_tail(log.with_suffix('.out'))}")

    def _start_munge(self) -> None:
        d = self.munge_socket.parent
        d.mkdir(parents=True, exist_ok=True)
        os.chmod(d, 0o700)
        key = d / "munge.key"
        subprocess.run([_which("mungekey"), "-c", "-k", str(key)], check=True, capture_output=True)
        os.chmod(key, 0o600)
        self._daemon("munged", [_which("munged"), "-F", "--force", "--key-file", str(key), "--socket",
                                str(self.munge_socket), "--pid-file", str(d / "munged.pid"), "--log-file",
                                str(self.log_dir / "munged.log"), "--seed-file", str(d / "munged.seed")],
                     self.log_dir / "munged.log")
        self._wait_for("munged", self.munge_socket.exists)

    def _start_mariadb(self) -> None:
        d = self.mysql_socket.parent
        data = d / "data"
        data.mkdir(parents=True, exist_ok=True)
        result = subprocess.run([_which("mariadb-install-db"), "--no-defaults", f"--datadir={data}", "--user=root",
                                 "--auth-root-authentication-method=normal", "--skip-test-db"],
                                capture_output=True, text=True)
        if result.returncode:
            raise Unavailable(f"mariadb-install-db exited with {result.returncode}: "
                              + " | ".join((result.stdout + result.stderr).splitlines()[-10:]))
        self.mysql_port = free_port()
        log = self.log_dir / "mariadbd.log"
        self._daemon("mariadbd", [_which("mariadbd"), "--no-defaults", f"--datadir={data}", "--user=root",
                                  "--skip-grant-tables", "--bind-address=127.0.0.1", f"--port={self.mysql_port}",
                                  f"--socket={self.mysql_socket}", f"--pid-file={d / 'mariadbd.pid'}",
                                  f"--log-error={log}", "--skip-log-bin", "--innodb-buffer-pool-size=16M",
                                  "--performance-schema=OFF"], log)
        self._wait_for("mariadbd", lambda: self._accepts(self.mysql_port))

    @staticmethod
    def _accepts(port: int) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return True
        except OSError:
            return False

    def _write_slurm_conf(self) -> None:
        etc, state, spool, run = (self.root / n for n in ("etc", "state", "spool", "run"))
        for p in (etc, state, spool, run, self.log_dir):
            p.mkdir(parents=True, exist_ok=True)
        self.dbd_port, self.ctld_port, self.slurmd_port = free_port(), free_port(), free_port()
        auth = f"AuthType=auth/munge\nAuthInfo=socket={self.munge_socket}\n"
        dbd = etc / "slurmdbd.conf"
        dbd.write_text(
            f"{auth}DbdHost=localhost\nDbdAddr=127.0.0.1\nDbdPort={self.dbd_port}\nSlurmUser=root\n"
            f"PidFile={run / 'slurmdbd.pid'}\nLogFile={self.log_dir / 'slurmdbd.log'}\nDebugLevel=info\n"
            f"StorageType=accounting_storage/mysql\nStorageHost=127.0.0.1\nStoragePort={self.mysql_port}\n"
            f"StorageUser=root\nStorageLoc=slurm_acct_db\n")
        os.chmod(dbd, 0o600)  # slurmdbd refuses a slurmdbd.conf others may read
        self.conf.write_text(
            f"ClusterName={CLUSTER_NAME}\nSlurmctldHost={self.host}(127.0.0.1)\nSlurmUser=root\nSlurmdUser=root\n"
            f"SlurmctldPort={self.ctld_port}\nSlurmdPort={self.slurmd_port}\n{auth}"
            f"StateSaveLocation={state}\nSlurmdSpoolDir={spool}/slurmd-%n\n"
            f"SlurmctldPidFile={run / 'slurmctld.pid'}\nSlurmdPidFile={run / 'slurmd.pid'}\n"
            f"SlurmctldLogFile={self.log_dir / 'slurmctld.log'}\nSlurmdLogFile={self.log_dir / 'slurmd.log'}\n"
            "SlurmctldDebug=info\nSlurmdDebug=info\n"
            "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\n"
            "SelectType=select/cons_tres\nSelectTypeParameters=CR_Core\nJobAcctGatherType=jobacct_gather/none\n"
            f"AccountingStorageType=accounting_storage/slurmdbd\nAccountingStorageHost=localhost\n"
            # the munge socket slurmctld signs its messages to slurmdbd with (not munge's default /run/munge)
            f"AccountingStoragePort={self.dbd_port}\nAccountingStoragePass={self.munge_socket}\n"
            "MpiDefault=none\nSwitchType=switch/none\nMailProg=/bin/true\n"
            # a cancelled or requeued job's processes are killed 10 s after its SIGTERM (long enough for a stopped
            # fit to exit and its job to write a result, as on a cluster's default 30 s); a node that restarts is
            # back in service; ended jobs stay in scontrol's view for the test's checks
            "KillWait=10\nReturnToService=2\nMinJobAge=3600\nInactiveLimit=0\nWaitTime=0\nSlurmdTimeout=60\n"
            # jobs, array tasks and those whose dependency is met start within a second or two
            "SchedulerType=sched/backfill\nSchedulerParameters=sched_interval=1,bf_interval=1,sched_min_interval=0\n"
            f"NodeName={self.host} NodeAddr=127.0.0.1 CPUs={self.cpus} State=UNKNOWN\n"
            f"PartitionName={PARTITION} Nodes={self.host} Default=YES MaxTime=INFINITE State=UP\n")

    def _start_slurmdbd(self) -> None:
        self._daemon("slurmdbd", [_which("slurmdbd"), "-D"], self.log_dir / "slurmdbd.log")
        self._wait_for("slurmdbd", lambda: self._accepts(self.dbd_port))

    def _start_slurmctld(self) -> None:
        self._daemon("slurmctld", [_which("slurmctld"), "-D", "-i"], self.log_dir / "slurmctld.log")
        def up() -> bool:
            ping = self.run(["scontrol", "ping"], check=False)
            return ping.returncode == 0 and "UP" in ping.stdout

        self._wait_for("slurmctld", up)

    def _start_slurmd(self) -> None:
        self._daemon("slurmd", [_which("slurmd"), "-D", "-N", self.host], self.log_dir / "slurmd.log")
        self._wait_for("slurmd", lambda: self.run(["sinfo", "-h", "-N", "-o", "%T"], check=False).stdout.strip()
                       == "idle", timeout_s=90)
        # the cluster is known to slurmdbd: sacct answers (submitit reads job states with it)
        self._wait_for("slurmdbd", lambda: self.run(["sacctmgr", "-n", "-P", "list", "cluster", "format=cluster"],
                                                     check=False).stdout.split() == [CLUSTER_NAME], timeout_s=30)

    # ------------------------------------------------------------------------------------------------ use
    def run(self, cmd: list[str], check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
        """A Slurm command against this cluster (``SLURM_CONF`` set), its output as text."""
        return subprocess.run(cmd, env=self.env, capture_output=True, text=True, check=check, timeout=timeout)

    def queue(self) -> list[str]:
        """The ids of every job in this cluster's queue (pending, running or completing)."""
        out = self.run(["squeue", "-h", "-o", "%i"], check=False).stdout
        return out.split()

    # ------------------------------------------------------------------------------------------------ stop
    def stop(self, timeout_s: float = 30.0) -> None:
        """Cancel every job, wait for the queue to empty, stop each daemon by its pid, then kill what is left with
        this cluster's SLURM_CONF in its environment. Safe to call more than once, and after a partial start."""
        names = [d[0] for d in self.daemons if d[1].poll() is None]
        if "slurmctld" in names:
            try:
                jobs = self.queue()
                if jobs:
                    self.run(["scancel", *jobs], check=False)
                deadline = time.monotonic() + timeout_s
                while self.queue() and time.monotonic() < deadline:
                    time.sleep(0.5)
            except (OSError, subprocess.SubprocessError):
                pass
        for _, proc, _ in reversed(self.daemons):
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=timeout_s)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=10)
        for pid in self.leftover_pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    def leftover_pids(self) -> list[int]:
        """Processes other than this one whose environment holds this cluster's SLURM_CONF (the daemons and their
        children: slurmstepd, a job's processes, a compare a test started) or that run one of the daemons with this
        cluster's folder on their command line (munged, mariadbd)."""
        mark = f"SLURM_CONF={self.conf}".encode()
        root = str(self.root).encode()
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) in (os.getpid(), os.getppid()):
                continue
            try:
                environ = (entry / "environ").read_bytes().split(b"\0")
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            daemon = cmdline.split(b"\0")[0].rsplit(b"/", 1)[-1] in {b"slurmstepd", b"slurmd", b"slurmctld",
                                                                    b"slurmdbd", b"munged", b"mariadbd"}
            if mark in environ or daemon and root in cmdline:
                found.append(int(entry.name))
        return found

    def logs(self) -> str:
        """Every daemon's log tail, for a failure's message."""
        return "\n".join(f"{name}: {_tail(log)}" for name, _, log in self.daemons)

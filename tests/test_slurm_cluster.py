"""`cosmos-pl compare --launcher slurm` on a real one-node Slurm cluster (tests/slurm_cluster.py: slurmctld, slurmd,
slurmdbd with MariaDB, munge, started by the tests): sbatch, squeue, sacct and scontrol for real.

One comparison (digits, cosmos and fedmd x seeds 0, 1, the settings of the local comparison `compared`) serves most
checks: one of its pair jobs is requeued by the scheduler once it has checkpointed round 0, the compare process is
killed (the login node dropped) while jobs are queued or running, and the same command run again waits for those
jobs instead of submitting them again. Slurm's own records (sacct, scontrol) show the dependency on the round-0 job,
the array's throttle and the requeue; the numbers equal the local launcher's byte for byte.

Also here: a cancelled job is a failed pair naming its Slurm log; a refused sbatch or a cluster without accounting
is one error line; Lightning inside a Slurm job stays a single-process Trainer (no SLURMEnvironment), checked in a
real job and, without a cluster, with a Slurm job's variables set.
"""

import json
import signal
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pytest

from cosmos_pl.cli import main
from conftest import PROCESS_TIMEOUT_S, until, with_out

CLUSTER = [pytest.mark.slurm_cluster, pytest.mark.slow, pytest.mark.xdist_group("slurm_cluster")]
# the Slurm settings of every comparison here: one CPU per job, no GPU, one job of an array at a time
SLURM = ["--launcher", "slurm", "--slurm.cpus_per_job", "1", "--slurm.gpus_per_job", "0",
         "--executor.workers_per_device", "1", "--slurm.time_min", "20", "--slurm.array_parallelism", "1",
         "--wandb.mode", "disabled"]
PAIRS = ("cosmos-seed0", "cosmos-seed1", "fedmd-seed0", "fedmd-seed1")


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory):
    """The test Slurm cluster, started once (its own folder, free ports); skips the test where it cannot start."""
    from slurm_cluster import SlurmCluster, Unavailable

    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm-cluster"))
    try:
        cluster.start()
    except (Unavailable, OSError, subprocess.SubprocessError) as err:
        pytest.skip(f"no test Slurm cluster: {' '.join(str(err).split())[-1500:]}")
    print(f"\ntest Slurm cluster up in {cluster.started_s:.1f} s (SLURM_CONF={cluster.conf})")
    try:
        yield cluster
    finally:
        cluster.stop()


def _compare(cluster, argv: list[str], log: Path) -> subprocess.Popen:
    """``cosmos-pl compare`` as a process of its own talking to ``cluster``, its output into ``log``."""
    with open(log, "w") as f:
        return subprocess.Popen([sys.executable, "-m", "cosmos_pl.cli", *argv], stdout=f, stderr=subprocess.STDOUT,
                                env=cluster.env)


def _jobs_json(out: Path) -> dict:
    try:
        return json.loads((out / "slurm" / "jobs.json").read_text())
    except (OSError, ValueError):
        return {}


def _recording(out: Path, *pairs: str) -> dict:
    """jobs.json once it holds the job id of every pair in ``pairs`` (run directory names), else {}."""
    recorded = _jobs_json(out)
    return recorded if all(str(out / "runs" / p) in recorded for p in pairs) else {}


def _states(cluster) -> dict[str, str]:
    """Every job in the queue, array tasks one by one: {job id: state}."""
    rows = cluster.run(["squeue", "-h", "-r", "-o", "%i|%T"], check=False).stdout.split()
    return dict(row.split("|", 1) for row in rows)


def _last_job_id(cluster) -> int:
    ids = cluster.run(["sacct", "-a", "-X", "-n", "-P", "-o", "JobIDRaw", "-S", "2000-01-01"]).stdout.split()
    return max((int(i) for i in ids), default=0)


def _sacct(cluster, after: int) -> tuple[list[str], list[dict]]:
    """sacct's records (every run of a requeued job too: --duplicates) of the jobs after job id ``after``: its
    lines as printed, and one dict per record."""
    out = cluster.run(["sacct", "-a", "-X", "-D", "-P", "-S", "2000-01-01", "-o",
                       "JobIDRaw,JobID,JobName,State,Submit,Start,End"]).stdout
    lines = out.splitlines()
    names = lines[0].split("|")
    records = [dict(zip(names, line.split("|"))) for line in lines[1:]]
    keep = [r for r in records if int(r["JobIDRaw"]) > after]
    return [lines[0], *(line for line, r in zip(lines[1:], records) if int(r["JobIDRaw"]) > after)], keep


def _time(stamp: str) -> datetime:
    return datetime.fromisoformat(stamp)


@pytest.fixture(scope="module")
def on_cluster(slurm_cluster, compared, tmp_path_factory):
    """The local comparison's argv with --launcher slurm on the test cluster: a pair job requeued by the scheduler
    once its round 0 is checkpointed, the compare process then killed, and the same command run again to the end.
    Returns what the checks read: the folder, the requeued pair and job, both compare outputs, sacct's records."""
    cluster = slurm_cluster
    _, local_argv = compared
    work = tmp_path_factory.mktemp("on-slurm")
    out = work / "out"
    argv = [*with_out(local_argv, out), *SLURM]
    before = _last_job_id(cluster)
    first = _compare(cluster, argv, work / "first.log")
    try:
        recorded = until(lambda: _recording(out, *PAIRS), "the pairs' job ids in jobs.json")
        queue_seen = cluster.run(["squeue", "-r"]).stdout  # the queue as a user sees it, for the docs

        def running_with_round0():
            states = _states(cluster)
            for name in PAIRS:
                run, job = out / "runs" / name, recorded[str(out / "runs" / name)]
                if (states.get(job) == "RUNNING" and (run / "checkpoints" / "round-0000.pt").is_file()
                        and not (run / "summary.json").exists()):
                    return name, job
            return None

        requeued, requeued_job = until(running_with_round0, "a running pair job with its round-0 checkpoint",
                                       every_s=0.1)
        cluster.run(["scontrol", "requeue", requeued_job])  # the scheduler pre-empts it: killed, queued again
        states = _states(cluster)
        first.send_signal(signal.SIGKILL)  # the login node dropped, jobs still queued or running
        first.wait(timeout=30)
    finally:
        if first.poll() is None:
            first.kill()
    assert any(s in ("PENDING", "RUNNING", "REQUEUED", "CONFIGURING", "COMPLETING") for s in states.values()), states
    # Slurm holds a requeued batch job for about 2 minutes (its EligibleTime, shown below) before it may start again;
    # the test lets it start at once, as an administrator may: what is tested is the pair resuming, not the wait
    until(lambda: _states(cluster).get(requeued_job) == "PENDING", "the requeued job back in the queue")
    cluster.run(["scontrol", "update", f"JobId={requeued_job}", "StartTime=now"])
    second = _compare(cluster, argv, work / "second.log")
    assert second.wait(timeout=PROCESS_TIMEOUT_S) == 0, (work / "second.log").read_text()
    lines, records = _sacct(cluster, before)
    show = cluster.run(["scontrol", "show", "job", requeued_job]).stdout
    print("\nsqueue -r while the first compare ran:\n" + queue_seen)
    print("sacct -a -X -D -P -o JobIDRaw,JobID,JobName,State,Submit,Start,End:\n" + "\n".join(lines))
    print(f"scontrol show job {requeued_job}:\n" + show)
    return {"out": out, "recorded": recorded, "requeued": requeued, "requeued_job": requeued_job,
            "first": (work / "first.log").read_text(), "second": (work / "second.log").read_text(),
            "records": records, "show": show}


def _cluster(test):
    """The marks of a test on the cluster: slurm_cluster, slow, and one xdist group (one worker starts it)."""
    for mark in CLUSTER:
        test = mark(test)
    return test


@_cluster
def test_the_slurm_comparison_equals_the_local_one(on_cluster, compared):
    """comparison.csv of the Slurm run, requeue and re-attach included, is byte-equal to --launcher local's; so are
    the requeued pair's records, and its log shows it resumed after round 0."""
    local, _ = compared
    out = on_cluster["out"]
    assert (out / "comparison.csv").read_bytes() == (local / "comparison.csv").read_bytes()
    pair = out / "runs" / on_cluster["requeued"]
    assert "resumed after round 0" in (pair / "log.txt").read_text()
    for name in ("metrics.csv", "clients.csv"):
        assert (pair / name).read_bytes() == (local / "runs" / on_cluster["requeued"] / name).read_bytes(), name


@_cluster
def test_the_rerun_waits_for_the_earlier_jobs_and_submits_nothing(on_cluster):
    """The compare run after the first was killed names the jobs still queued or running and submits none; Slurm
    saw 2 round-0 jobs and 4 pair jobs in all (jobs.json keeps each id)."""
    second = on_cluster["second"]
    assert "Slurm job(s) an earlier compare submitted" in second, second
    assert "submitted" not in second.replace("an earlier compare submitted", ""), second
    ids = {r["JobID"] for r in on_cluster["records"]}
    round0 = {r["JobID"] for r in on_cluster["records"] if "_" not in r["JobID"]}
    assert len(round0) == 2 and len(ids) == 6, sorted(ids)
    recorded = _jobs_json(on_cluster["out"])
    assert sorted(recorded.values()) == sorted(ids), recorded


@_cluster
def test_pair_jobs_start_after_their_round0_job_one_at_a_time_per_array(on_cluster):
    """From sacct: every run of a pair job started at or after its seed's round-0 job ended (afterany), and no two
    runs of one job array overlapped (array_parallelism 1)."""
    records, recorded = on_cluster["records"], on_cluster["recorded"]
    by_id: dict[str, list[dict]] = {}
    for r in records:
        by_id.setdefault(r["JobID"], []).append(r)
    arrays: dict[str, list[dict]] = {}
    for seed in (0, 1):
        [round0_key] = [k for k in recorded
                        if Path(k).parent.name == "jobs" and Path(k).name.startswith(f"seed{seed}-")]
        [round0] = by_id[recorded[round0_key]]
        assert round0["State"] == "COMPLETED", round0
        for alg in ("cosmos", "fedmd"):
            job = recorded[str(on_cluster["out"] / "runs" / f"{alg}-seed{seed}")]
            for run in by_id[job]:
                assert _time(run["Start"]) >= _time(round0["End"]), (run, round0)
                arrays.setdefault(job.split("_")[0], []).append(run)
    assert len(arrays) == 2
    for runs in arrays.values():
        runs.sort(key=lambda r: _time(r["Start"]))
        for a, b in zip(runs, runs[1:]):
            assert _time(b["Start"]) >= _time(a["End"]), (a, b)


@_cluster
def test_the_requeued_job_shows_its_requeue(on_cluster):
    """sacct keeps the requeued job's first run as REQUEUED, and scontrol counts the restart."""
    runs = [r for r in on_cluster["records"] if r["JobID"] == on_cluster["requeued_job"]]
    assert [r["State"] for r in runs] == ["REQUEUED", "COMPLETED"], runs
    assert "Restarts=1 " in on_cluster["show"], on_cluster["show"]


@_cluster
def test_no_srun_hint_in_the_pairs_logs(on_cluster, compared):
    """Where srun is installed, Lightning left to itself prints a hint to use it on every fit outside a Slurm step
    (the local comparison) and takes a Slurm step's variables as its processes' layout inside one (the jobs):
    cosmos-pl's Trainer is a single-process one everywhere, and no pair's or round-0 job's log names srun."""
    local, _ = compared
    logs = [*(on_cluster["out"] / "runs").glob("*/log.txt"), *(on_cluster["out"] / "round0").glob("jobs/*/log.txt"),
            *(local / "runs").glob("*/log.txt")]
    assert len(logs) == 10, logs
    for log in logs:
        assert "srun" not in log.read_text(), log


@_cluster
def test_a_cancelled_job_is_a_failed_pair_naming_its_slurm_log(slurm_cluster, repo_root, tmp_path):
    """One pair whose job is cancelled while it waits for its round 0: compare exits 1, and its output and report
    name the job's state and its Slurm log."""
    from conftest import FAST

    out = tmp_path / "out"
    argv = ["compare", "--config", str(repo_root / "configs/digits_smoke.yaml"), "--algorithms", "fedmd", "--seeds",
            "0", "--out", str(out), *FAST, *SLURM]
    proc = _compare(slurm_cluster, argv, tmp_path / "compare.log")
    try:
        recorded = until(lambda: _recording(out, "fedmd-seed0"), "the pair's job id in jobs.json")
        slurm_cluster.run(["scancel", *recorded.values()])  # the pair's job and its round-0 job
        assert proc.wait(timeout=PROCESS_TIMEOUT_S) == 1
    finally:
        if proc.poll() is None:
            proc.kill()
    job = recorded[str(out / "runs" / "fedmd-seed0")]
    log = out / "slurm" / f"{job}_0_log.out"
    text = (tmp_path / "compare.log").read_text()
    print(text)
    assert f"Slurm job {job} ended CANCELLED by 0 without a result (Slurm log:" in " ".join(text.split()), text
    assert str(log) in "".join(text.split()), text
    assert str(log) in (out / "comparison.md").read_text()


@_cluster
def test_sbatch_refusing_a_job_is_one_error_line(slurm_cluster, repo_root, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SLURM_CONF", str(slurm_cluster.conf))
    argv = ["compare", "--config", str(repo_root / "configs/digits_smoke.yaml"), "--algorithms", "fedmd", "--seeds",
            "0", "--out", str(tmp_path / "out"), *SLURM, "--slurm.partition", "nosuch"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    print(err)
    assert len(err.strip().splitlines()) == 1 and err.startswith("cosmos-pl: error: --launcher slurm: "), err
    assert "invalid partition" in err.lower() and "Traceback" not in err, err


@_cluster
def test_a_cluster_without_accounting_is_refused_before_submitting(slurm_cluster, repo_root, tmp_path, monkeypatch,
                                                                    capsys):
    """With accounting off (no slurmdbd), sacct cannot tell a job's state: compare refuses in one line naming
    sacct and slurmdbd, and submits nothing."""
    conf = tmp_path / "slurm.conf"
    conf.write_text("".join(line for line in slurm_cluster.conf.read_text().splitlines(keepends=True)
                            if not line.startswith("AccountingStorage")))
    monkeypatch.setenv("SLURM_CONF", str(conf))
    before = slurm_cluster.queue()
    out = tmp_path / "out"
    argv = ["compare", "--config", str(repo_root / "configs/digits_smoke.yaml"), "--algorithms", "fedmd", "--seeds",
            "0", "--out", str(out), *SLURM]
    assert main(argv) == 2
    err = capsys.readouterr().err
    print(err)
    assert len(err.strip().splitlines()) == 1 and err.startswith("cosmos-pl: error: --launcher slurm: "), err
    assert "sacct" in err and "slurmdbd" in err, err
    assert slurm_cluster.queue() == before and not (out / "slurm" / "jobs.json").exists()


# a stage's Trainer built inside a job, with its cluster environment and the handlers it has while it trains
_TRAINER_IN_A_JOB = """
import os, signal, sys, torch
sys.stdout.reconfigure(line_buffering=True)
os.dup2(1, 2)  # warnings and prints in one stream, in order (srun forwards two streams as it reads them)
import lightning.pytorch as pl
from cosmos_pl.training.config import TrainerConfig
from cosmos_pl.training.engine import make_trainer

print("SLURM_JOB_ID", os.environ["SLURM_JOB_ID"], "SLURM_NTASKS", os.environ.get("SLURM_NTASKS"),
      "SLURM_STEP_ID", os.environ.get("SLURM_STEP_ID"))
trainer = make_trainer(TrainerConfig(accelerator="cpu"), epochs=1)
print("cluster environment:", type(trainer._accelerator_connector.cluster_environment).__name__)

def names(handler):
    return [h.__qualname__ if callable(h) else signal.Handlers(h).name
            for h in getattr(handler, "signal_handlers", [handler])]

class Probe(pl.Callback):
    def on_train_start(self, trainer, module):
        usr1, term = names(signal.getsignal(signal.SIGUSR1)), names(signal.getsignal(signal.SIGTERM))
        print(f"while training: SIGUSR1 {usr1} SIGTERM {term}", flush=True)

class Tiny(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)
    def training_step(self, batch, _):
        return self.layer(batch[0]).pow(2).mean()
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

trainer.callbacks.append(Probe())
data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.ones(4, 2)), batch_size=2)
trainer.fit(Tiny(), data)
print("fit done")
"""


@_cluster
def test_lightning_in_a_slurm_job_is_a_single_process_trainer(slurm_cluster, tmp_path):
    """A stage's Trainer built in a real batch job with submitit's resources (one node, one task), once in the batch
    step and once under ``srun`` (as submitit starts a job's Python, whose pair processes inherit the step's
    variables): both times LightningEnvironment, not SLURMEnvironment: no srun hint, and while it trains no Slurm
    requeue handler of Lightning's own (SIGUSR1 left as it was; SIGTERM only Lightning's notifier)."""
    script = tmp_path / "trainer.py"
    script.write_text(_TRAINER_IN_A_JOB)
    log = tmp_path / "job.out"
    submitted = slurm_cluster.run(["sbatch", "--parsable", "--nodes=1", "--ntasks-per-node=1", "--cpus-per-task=1",
                                   "--job-name=trainer-check", f"--output={log}", "--wrap",
                                   f"{sys.executable} {script} && srun --unbuffered {sys.executable} {script}"])
    job = submitted.stdout.strip()
    until(lambda: job not in slurm_cluster.queue(), f"job {job} to end", timeout_s=PROCESS_TIMEOUT_S, every_s=0.5)
    text = log.read_text()
    print(text)
    assert text.count("fit done") == 2, text
    assert f"SLURM_JOB_ID {job} SLURM_NTASKS 1 SLURM_STEP_ID None" in text  # the batch step
    assert f"SLURM_JOB_ID {job} SLURM_NTASKS 1 SLURM_STEP_ID 0" in text  # srun's step
    assert text.count("cluster environment: LightningEnvironment") == 2, text
    assert "srun" not in text
    assert text.count("while training: SIGUSR1 ['SIG_DFL'] SIGTERM "
                      "['_SignalConnector._sigterm_notifier_fn'") == 2, text
    assert "_slurm_sigusr_handler_fn" not in text and "_sigterm_handler_fn" not in text


def test_lightnings_srun_hint_is_held_back_during_a_stage(monkeypatch):
    """Lightning's fit asks SLURMEnvironment.detect() whatever the Trainer's cluster environment, which warns where
    srun is installed and this process is no srun step: held back inside quiet_lightning (every stage's fit runs
    there), and only there."""
    import warnings

    from lightning.fabric.plugins.environments import slurm

    from cosmos_pl.training.engine import quiet_lightning

    monkeypatch.setattr(slurm.shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.delenv("SLURM_NTASKS", raising=False)
    with warnings.catch_warnings(record=True) as outside:
        warnings.simplefilter("always")
        slurm.SLURMEnvironment.detect()
    assert any("The `srun` command is available" in str(w.message) for w in outside), outside
    with warnings.catch_warnings(record=True) as inside:
        warnings.simplefilter("always")
        with quiet_lightning():
            slurm.SLURMEnvironment.detect()
    assert [str(w.message) for w in inside] == []


def test_make_trainer_ignores_a_slurm_jobs_variables(monkeypatch):
    """With a Slurm job's variables set (one task, a job name), make_trainer's cluster environment is still
    LightningEnvironment, where Lightning alone would take SLURMEnvironment (checked on the same variables)."""
    from lightning.pytorch import Trainer
    from lightning.pytorch.plugins.environments import LightningEnvironment, SLURMEnvironment

    from cosmos_pl.training.config import TrainerConfig
    from cosmos_pl.training.engine import make_trainer

    for name, value in {"SLURM_NTASKS": "1", "SLURM_JOB_NAME": "cosmos-pl", "SLURM_PROCID": "0",
                        "SLURM_LOCALID": "0", "SLURM_NODEID": "0", "SLURM_JOB_ID": "7"}.items():
        monkeypatch.setenv(name, value)
    bare = Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False)
    assert isinstance(bare._accelerator_connector.cluster_environment, SLURMEnvironment)
    env = make_trainer(TrainerConfig(accelerator="cpu"), epochs=1)._accelerator_connector.cluster_environment
    assert type(env) is LightningEnvironment

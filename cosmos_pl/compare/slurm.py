"""``cosmos-pl compare --launcher slurm``: every pair a Slurm job, submitted with submitit.

The pairs to run are grouped by the settings that decide their round 0 (:func:`cosmos_pl.config.round0_key`: one
group per seed, or per seed and data point of a grid). Each group gets one round-0 job (``fit --round0_only``,
which fills the comparison's round-0 cache, ``OUT/round0``), and its pairs one job array that starts when that job
has ended (``--dependency=afterany``: should round 0 fail there, each pair trains its own and says why), at most
``slurm.array_parallelism`` at a time. With ``slurm.cluster local`` (submitit's local executor: no scheduler) a
group's pairs are submitted once its round-0 job has ended.

A job runs its pair as ``compare --launcher local`` does (:func:`~cosmos_pl.compare.pairs.launch`: ``fit`` in a
process of its own, logging to the pair's ``log.txt``, resuming from the last round checkpoint when there is one).
When Slurm pre-empts the job or its time limit nears, it sends the job submitit's signal (USR2,
``slurm.signal_delay_s`` before the limit); submitit then calls :meth:`PairJob.checkpoint`, which stops the pair
with SIGTERM (the run keeps its last complete round) and hands submitit the same job to requeue: the requeued job
continues with ``fit --resume``, the path ``compare --launcher local`` takes for an interrupted pair. A job that
reaches its time limit more than ``slurm.max_requeues`` times fails. A job Slurm ends without notice (``scancel``,
``scontrol requeue``, a pre-emption that requeues at once) gets SIGTERM, which also stops its ``fit`` after its
last complete round; the job then writes no result and waits for Slurm's SIGKILL, so that ``compare`` never takes
a requeued pair for a failed one, and the requeued job resumes it.

Before submitting, ``compare`` checks that ``sacct`` answers (submitit follows each job's state with it, which needs
Slurm's accounting, slurmdbd) and refuses in one line where it does not; a job sbatch refuses is one error line
too. ``compare`` waits for every job, then writes the report; a failed job's row names its Slurm log. Stopped
while it waits (Ctrl-C, or its login session ended), compare leaves the jobs running; the next ``compare`` with the
same arguments skips the finished pairs and, on Slurm, waits for the jobs still queued or running (the pairs' and
the round-0 jobs' ids are kept in ``slurm/jobs.json``) instead of submitting them again.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Optional

from rich.console import Console

from cosmos_pl.compare.pairs import RUNNING, Pair, failure_line, launch, run_logged
from cosmos_pl.config import SlurmConfig
from cosmos_pl.errors import ConfigError
from cosmos_pl.files import atomic_write_text
from cosmos_pl.progress import line_every_s

__all__ = ["PairJob", "Round0Job", "check_sacct", "make_executor", "execute_slurm", "stop_running"]

# Slurm states of a job that is still to end (sacct's names, as submitit reports them; PREEMPTED: a pre-empted job
# Slurm is about to requeue)
_ACTIVE = {"PENDING", "RUNNING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "CONFIGURING", "COMPLETING",
           "SUSPENDED", "RESIZING", "SIGNALING", "STAGE_OUT", "PREEMPTED"}
POLL_S = 5.0  # seconds between two looks at the Slurm jobs' states (local jobs: every second)


def _job_signal() -> int:
    """The signal submitit's job environment answers (USR2 unless ``SUBMITIT_PREEMPT_SIGNAL`` says otherwise)."""
    from submitit import JobEnvironment

    return int(JobEnvironment._usr_sig())


def stop_running(grace_s: float = 60.0) -> None:
    """SIGTERM to every pair process this job runs, and wait until each has exited (SIGKILL after ``grace_s``
    seconds). Called from a signal handler: it reaps with ``os.waitpid`` and never takes ``Popen``'s lock, which
    the interrupted ``Popen.wait`` may hold."""
    procs = list(RUNNING)
    for proc in procs:
        try:
            proc.send_signal(signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace_s
    for proc in procs:
        while True:
            try:
                pid, _ = os.waitpid(proc.pid, os.WNOHANG)
            except ChildProcessError:  # already reaped
                break
            if pid:
                break
            if time.monotonic() > deadline:
                proc.kill()
                deadline = time.monotonic() + 10.0
            time.sleep(0.2)


# how long a job that Slurm has sent SIGTERM (scancel, scontrol requeue, pre-emption) waits for Slurm's SIGKILL
# (slurm.conf's KillWait, 30 s by default) before it reports its pair's failure
ENDING_WAIT_S = 300.0


def _unless_ended(run: Any) -> Optional[str]:
    """``run()`` (a pair's or round 0's ``fit``: None, or why it failed), in a Slurm job that notes a SIGTERM. Slurm
    sends the whole job SIGTERM when it ends it (cancelled, requeued by ``scontrol requeue`` or a pre-emption
    without notice), then SIGKILL after its KillWait; the ``fit`` stops after its last complete round. Its failure
    is then not reported: a result written now would tell ``compare`` the pair failed while the requeued job is to
    resume it. The job waits for the SIGKILL instead (reporting after :data:`ENDING_WAIT_S` seconds, should none
    come). Outside a Slurm job (submitit's local executor) it only runs ``run``."""
    if os.environ.get("SUBMITIT_EXECUTOR") != "slurm":
        return run()
    ended: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: ended.append(signum))
    try:
        error = run()
    finally:
        signal.signal(signal.SIGTERM, previous)
    if error is not None and ended:
        time.sleep(ENDING_WAIT_S)
    return error


class PairJob:
    """The Slurm job of one pair (a submitit checkpointable callable): runs it, and when pre-empted or about to
    reach its time limit stops it and has submitit requeue the job, which resumes it.

    Returns (from the job): None when the pair finished, else a one-line reason with its log.
    """

    def __init__(self, pair: Pair) -> None:
        self.pair = pair

    def __call__(self) -> Optional[str]:
        return _unless_ended(lambda: launch(self.pair, ignore=(_job_signal(),)))

    def checkpoint(self, *args: Any, **kwargs: Any) -> Any:
        """submitit's hook on pre-emption or time-out: stop the pair (it keeps its last complete round); the job
        requeued runs :meth:`__call__` again, which resumes the pair from that round (``fit --resume``)."""
        from submitit.helpers import DelayedSubmission

        stop_running()
        return DelayedSubmission(PairJob(self.pair))


class Round0Job:
    """The Slurm job that trains the round 0 of a group of pairs into the comparison's round-0 cache
    (``fit --round0_only``, with the first pair's config); requeued from the start when pre-empted.

    Returns (from the job): None when round 0 is in the cache, else a one-line reason with its log.
    """

    def __init__(self, pair: Pair, folder: Path) -> None:
        self.pair, self.folder = pair, folder

    def __call__(self) -> Optional[str]:
        return _unless_ended(self._run)

    def _run(self) -> Optional[str]:
        self.folder.mkdir(parents=True, exist_ok=True)
        config = self.folder / "pair.yaml"
        atomic_write_text(config, self.pair.config_yaml)
        log = self.folder / "log.txt"
        cmd = [sys.executable, "-m", "cosmos_pl.cli", "fit", "--config", str(config), "--round0_only", "true",
               "--run_dir", str(self.folder / "run"), "--overwrite", "true", "--wandb.mode", "disabled"]
        status = run_logged(cmd, log, "a", ignore=(_job_signal(),))
        return None if status == 0 else f"round 0 {failure_line(status, log)}"

    def checkpoint(self, *args: Any, **kwargs: Any) -> Any:
        from submitit.helpers import DelayedSubmission

        stop_running()
        return DelayedSubmission(Round0Job(self.pair, self.folder))


def make_executor(settings: SlurmConfig, folder: Path) -> Any:
    """The submitit executor of ``settings.cluster`` (``SlurmExecutor``, ``LocalExecutor`` or ``DebugExecutor``)
    with the jobs' resources of ``settings``."""
    import submitit

    if settings.cluster == "debug":
        return submitit.DebugExecutor(folder=folder)
    if settings.cluster == "local":
        executor = submitit.LocalExecutor(folder=folder, max_num_timeout=settings.max_requeues)
        executor.update_parameters(timeout_min=settings.time_min, gpus_per_node=settings.gpus_per_job,
                                   tasks_per_node=1, signal_delay_s=settings.signal_delay_s, stderr_to_stdout=True)
        return executor
    executor = submitit.SlurmExecutor(folder=folder, max_num_timeout=settings.max_requeues)
    executor.update_parameters(
        job_name="cosmos-pl", time=settings.time_min, cpus_per_task=settings.cpus_per_job,
        gpus_per_node=settings.gpus_per_job or None, ntasks_per_node=1, nodes=1, stderr_to_stdout=True,
        partition=settings.partition, array_parallelism=settings.array_parallelism,
        signal_delay_s=settings.signal_delay_s, setup=list(settings.setup),
        additional_parameters=dict(settings.sbatch),
        **({"mem": f"{settings.mem_gb:g}GB"} if settings.mem_gb is not None else {}))
    return executor


def _round0_groups(pairs: list[Pair]) -> dict[Optional[str], list[Pair]]:
    """The pairs grouped by the settings that decide their round 0
    (:attr:`~cosmos_pl.compare.plan.Pair.round0_group`, the round-0 cache's key), in the order of each group's
    first pair."""
    groups: dict[Optional[str], list[Pair]] = defaultdict(list)
    for p in pairs:
        groups[p.round0_group].append(p)
    return groups


def _recorded(folder: Path) -> dict[str, str]:
    try:
        return json.loads((folder / "jobs.json").read_text())
    except (OSError, ValueError):
        return {}


def _active(job: Any) -> bool:
    """Whether a Slurm job an earlier compare submitted is still to end: its state in sacct, or, where sacct does not
    know the job (yet: slurmctld hands jobs to slurmdbd a moment after they are submitted), in ``scontrol``."""
    state = job.state.split()[0] if job.state else "UNKNOWN"
    if state != "UNKNOWN":
        return state in _ACTIVE
    try:
        shown = subprocess.run(["scontrol", "show", "job", str(job.job_id)], capture_output=True, text=True,
                               timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    states = [part.split("=", 1)[1] for part in shown.split() if part.startswith("JobState=")]
    return any(s in _ACTIVE for s in states)


def check_sacct() -> None:
    """Raises ConfigError unless ``sacct`` answers here: submitit follows every job's state with it, and without
    Slurm's accounting (slurmdbd) a job that ended without a result (cancelled, failed) would be waited for
    forever, and one still queued could not be told from one that ended."""
    try:
        done = subprocess.run(["sacct", "-n", "-X", "-P", "-o", "JobID", "-S", "now"], capture_output=True,
                              text=True, timeout=120)
        reason = f"exit status {done.returncode}: {' '.join((done.stderr or done.stdout).split())[:300]}"
        ok = done.returncode == 0
    except (OSError, subprocess.SubprocessError) as err:
        reason, ok = f"{type(err).__name__}: {' '.join(str(err).split())[:300]}", False
    if not ok:
        raise ConfigError(f"--launcher slurm: sacct cannot read the jobs' states here ({reason}); compare follows "
                          f"its jobs with sacct, which needs Slurm's accounting (slurmdbd, AccountingStorageType="
                          f"accounting_storage/slurmdbd in slurm.conf): run compare on a login node where sacct "
                          f"works, or try the jobs here with --slurm.cluster local")


def _failure(job: Any, what: str) -> Optional[str]:
    """None when ``job`` returned None, else why it failed, with its Slurm log."""
    from submitit.core.utils import UncompletedJobError

    log = job.paths.stdout
    try:
        error = job.result()
    except Exception as err:  # the job failed, was cancelled, or timed out too many times
        if type(err) is UncompletedJobError:  # no result at all (not its subclass FailedJobError: the job raised)
            return f"{what} Slurm job {job.job_id} ended {job.state} without a result (Slurm log: {log})"
        reason = " ".join(str(err).split())[-200:]
        return f"{what} Slurm job {job.job_id} ended {job.state}: {reason} (Slurm log: {log})"
    return None if error is None else f"{error} (Slurm log: {log})"


def execute_slurm(todo: list[Pair], settings: SlurmConfig, out: Path, console: Console) -> dict[str, Optional[str]]:
    """Submit the pairs ``todo`` as Slurm jobs (with their round-0 jobs) and wait for all of them; returns each
    pair's error (None: it finished), by :attr:`~cosmos_pl.compare.plan.Pair.key`, as
    :func:`~cosmos_pl.compare.pairs.execute_pairs` does. The pairs share a round-0 job by their
    :attr:`~cosmos_pl.compare.plan.Pair.round0_group`, which the plan set (``--launcher slurm``)."""
    errors: dict[str, Optional[str]] = {}
    if not todo:
        return errors
    import submitit

    folder = Path(settings.folder) if settings.folder else out / "slurm"
    folder.mkdir(parents=True, exist_ok=True)
    if settings.cluster == "slurm":
        check_sacct()
    executor = make_executor(settings, folder)
    recorded = _recorded(folder)
    jobs: dict[str, Any] = {}
    if settings.cluster == "slurm":  # a job an earlier compare submitted that is still to end: wait for it
        for p in todo:
            job_id = recorded.get(p.key)
            if job_id:
                job = submitit.SlurmJob(folder=folder, job_id=job_id)
                if _active(job):
                    jobs[p.key] = job
    waiting = [p for p in todo if p.key not in jobs]
    if jobs:
        console.print(f"waiting for {len(jobs)} Slurm job(s) an earlier compare submitted: "
                      + ", ".join(f"{Path(key).name} ({job.job_id})" for key, job in jobs.items()))
    refused = io.StringIO()  # what submitit prints of a refused sbatch: said once, in the error line
    try:
        with contextlib.redirect_stderr(refused):
            _submit(waiting, settings, executor, folder, out, jobs, recorded, console)
    except (OSError, subprocess.CalledProcessError, submitit.core.utils.FailedJobError) as err:
        # no sbatch here, or Slurm refused the job (submitit raises FailedJobError with sbatch's error output)
        reason = " ".join(str(err).split())[:300]
        raise ConfigError(f"--launcher slurm: the jobs could not be submitted ({type(err).__name__}: {reason}); "
                          f"run compare where sbatch works (a login node), fix the slurm settings, or try the jobs "
                          f"here with --slurm.cluster local") from None
    if settings.cluster == "slurm":
        _wait(jobs, console, POLL_S, refresh=submitit.SlurmJob.watcher.update)
    else:
        _wait(jobs, console, 1.0)
    for key, job in jobs.items():
        errors[key] = _failure(job, "the pair's")
        console.print(f"{key} ({'failed' if errors[key] else 'done'}, job {job.job_id})")
    return errors


def _submit(waiting: list[Pair], settings: SlurmConfig, executor: Any, folder: Path, out: Path,
            jobs: dict[str, Any], recorded: dict[str, str], console: Console) -> None:
    """Submit each round-0 group's round-0 job and its pairs' job array into ``jobs`` (by run directory), recording the
    ids in ``folder/jobs.json`` (a round-0 job's by its folder: a round-0 job an earlier compare submitted for the
    same folder that is still to end is waited for instead of submitted again)."""
    import submitit

    groups = list(_round0_groups(waiting).values())
    round0_jobs = []
    for k, group in enumerate(groups):  # every round 0 first: they run side by side
        first = group[0]
        round0_folder = out / "round0" / "jobs" / f"seed{first.seed}-{k}"
        earlier = recorded.get(str(round0_folder))
        earlier_job = (submitit.SlurmJob(folder=folder, job_id=earlier) if settings.cluster == "slurm" and earlier
                       else None)
        if earlier_job is not None and _active(earlier_job):
            round0_jobs.append(earlier_job)
            console.print(f"round 0 of seed {first.seed}: job {earlier}, submitted by an earlier compare")
        else:
            round0_jobs.append(executor.submit(Round0Job(first, round0_folder)))
            console.print(f"submitted round 0 of seed {first.seed} ({len(group)} pair(s) after it): "
                          f"job {round0_jobs[-1].job_id}")
        recorded[str(round0_folder)] = str(round0_jobs[-1].job_id)
    for group, round0 in zip(groups, round0_jobs):
        first = group[0]
        if settings.cluster == "slurm":
            executor.update_parameters(additional_parameters={
                **settings.sbatch, "dependency": f"afterany:{round0.job_id}"})
        else:  # no scheduler to hold the pairs back: wait here
            error = _failure(round0, "round-0")
            if error:
                console.print(f"[yellow]round 0 of seed {first.seed} failed; each pair trains its own[/yellow]: "
                              f"{error}")
        with executor.batch():
            submitted = [(p, executor.submit(PairJob(p))) for p in group]
        for p, job in submitted:
            jobs[p.key] = job
            console.print(f"submitted {p.label} -> {p.run_dir}: job {job.job_id}")
        recorded.update({key: str(job.job_id) for key, job in jobs.items()})
        atomic_write_text(folder / "jobs.json", json.dumps(recorded, indent=1))


def _wait(jobs: dict[str, Any], console: Console, poll_s: float, refresh: Any = None) -> None:
    """Until every job has ended, a line each :func:`~cosmos_pl.progress.line_every_s` seconds saying how many
    have (and when one ends, which). ``refresh``: called before each look (one sacct for every Slurm job: submitit
    alone asks sacct less and less often, up to every 10 minutes, and a job that ended without a result, e.g.
    cancelled, is seen only by its state)."""
    every, last = line_every_s(), time.monotonic()
    ended: set[str] = set()
    while len(ended) < len(jobs):
        if refresh is not None:
            refresh()
        for key, job in jobs.items():
            if key not in ended and job.done():
                ended.add(key)
                console.print(f"job {job.job_id} of {key} ended ({len(ended)}/{len(jobs)})")
        if len(ended) < len(jobs):
            if time.monotonic() - last >= every:
                last = time.monotonic()
                console.print(f"Slurm jobs: {len(ended)}/{len(jobs)} ended")
            time.sleep(poll_s)

"""`cosmos-pl compare` on digits: two algorithms x two seeds, every file it writes, and a rerun that skips; the same
comparison through `--launcher slurm` (submitit's local executor), one job pre-empted, and W&B's offline runs."""

import csv
import json
import os
import re
import shutil
import signal
import threading
import time
from pathlib import Path
from typing import Optional

import pytest

from cosmos_pl.cli import main
from conftest import with_out

# the tests here read one compare of 4 pairs (each a fit process, shared with tests/test_slurm_cluster.py) or its
# Slurm twin (submitit's local executor), a module fixture: one worker computes it (`pytest --dist loadgroup`, as
# `make test` runs it; a module fixture is otherwise made again on every worker)
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("compare")]

# `compared` (tests/conftest.py): cosmos and fedmd x seeds 0, 1 with --launcher local, computed once per pytest run


def test_every_pair_and_report_file_is_written(compared):
    out, _ = compared
    for name in ("cosmos-seed0", "cosmos-seed1", "fedmd-seed0", "fedmd-seed1"):
        run = out / "runs" / name
        for f in ("pair.yaml", "config.yaml", "partition.json", "metrics.csv", "clients.csv", "summary.json", "log.txt"):
            assert (run / f).is_file(), (name, f)
    for f in ("comparison.md", "comparison.csv", "communication.md", "accuracy_vs_round.png"):
        assert (out / f).is_file(), f


def test_a_pairs_log_without_a_terminal_has_progress_lines_and_no_blank_line(compared):
    """Each pair's fit writes to log.txt (no terminal): every stage of every round ends with one plain line, and
    no line is empty (where a transient progress bar once left one)."""
    out, _ = compared
    for log in (out / "runs").glob("*/log.txt"):
        lines = log.read_text().splitlines()
        assert all(line.strip() for line in lines), log
        assert any(re.fullmatch(r"round 1: .+: \d+/\d+ tasks in \d+ s", line) for line in lines), log


def test_pairs_of_a_seed_share_the_partition_and_round_zero(compared):
    out, _ = compared
    for seed in (0, 1):
        a, b = (out / "runs" / f"{alg}-seed{seed}" for alg in ("cosmos", "fedmd"))
        assert (a / "partition.json").read_text() == (b / "partition.json").read_text()
        rows = [list(csv.DictReader(open(d / "metrics.csv"))) for d in (a, b)]
        assert rows[0][0]["client_acc_mean"] == rows[1][0]["client_acc_mean"]  # same round-0 local-only models


def test_report_numbers_come_from_the_pairs(compared):
    out, _ = compared
    finals = {}
    for alg in ("cosmos", "fedmd"):
        finals[alg] = [json.loads((out / "runs" / f"{alg}-seed{s}" / "summary.json").read_text())["final"]
                       ["personalized_acc"]["mean"] for s in (0, 1)]
    with open(out / "comparison.csv") as f:
        table = {r["algorithm"]: r for r in csv.DictReader(f)}
    for alg, values in finals.items():
        assert float(table[alg]["final_mean"]) == pytest.approx(sum(values) / 2, abs=1e-6)
        assert float(table[alg]["final_sem"]) == pytest.approx(abs(values[0] - values[1]) / 2, abs=1e-6)
    assert table["cosmos"]["scored_model"] == "cluster teacher h_pi(i)"
    assert table["fedmd"]["scored_model"] == "client model f_i"
    comm = (out / "communication.md").read_text()
    assert "| cosmos | 1 |" in comm and "| fedmd | 1 |" in comm


def test_rerun_skips_finished_pairs(compared, capsys):
    out, argv = compared
    stamps = {p: p.stat().st_mtime_ns for p in (out / "runs").glob("*/summary.json")}
    capsys.readouterr()
    assert main(argv) == 0
    assert "4 already finished" in capsys.readouterr().out
    assert stamps == {p: p.stat().st_mtime_ns for p in (out / "runs").glob("*/summary.json")}


def test_a_finished_pair_with_another_config_is_an_error(compared, capsys):
    out, argv = compared
    assert main([*argv, "--clients.batch_size", "16"]) == 2
    assert "different config" in capsys.readouterr().err


def test_bad_names_fail_before_any_pair_runs(repo_root, tmp_path, capsys):
    cfg = str(repo_root / "configs/digits_smoke.yaml")
    assert main(["compare", "--config", cfg, "--algorithms", "cosmos,fedmdd", "--out", str(tmp_path / "x")]) == 2
    assert "did you mean 'fedmd'" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()
    assert main(["compare", "--config", cfg, "--algorithms", "fedavg", "--out", str(tmp_path / "y")]) == 2
    assert "same backbone" in capsys.readouterr().err


def test_an_interrupted_pair_resumes_from_its_last_round(compared, tmp_path, capsys):
    """A pair stopped after round 0 (its round-1 checkpoint and summary missing) continues from round 0's
    checkpoint on the next compare, with the same numbers; finished pairs are not touched."""
    out, argv = compared
    copy = tmp_path / "out"
    shutil.copytree(out, copy)
    pair = copy / "runs" / "cosmos-seed0"
    (pair / "summary.json").unlink()
    (pair / "checkpoints" / "round-0001.pt").unlink()
    assert main(with_out(argv, copy)) == 0
    assert "3 already finished" in capsys.readouterr().out
    assert "resumed after round 0" in (pair / "log.txt").read_text()
    original = out / "runs" / "cosmos-seed0"
    for name in ("metrics.csv", "clients.csv"):
        assert (pair / name).read_bytes() == (original / name).read_bytes(), name


def _pid_of(*parts: str) -> Optional[int]:
    """The pid of a process whose command line holds every one of ``parts`` (Linux /proc), or None."""
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if proc.name.isdigit() and all(any(part in arg for arg in cmdline) for part in parts):
            return int(proc.name)
    return None


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _preempt_when(checkpoint: Path, pair_yaml: Path, done: dict) -> None:
    """Once ``checkpoint`` exists, send the pair's Slurm job (the submitit process that runs the pair's ``fit``)
    the signal Slurm sends before pre-emption or the time limit, as Slurm would."""
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and not checkpoint.exists():
        time.sleep(0.05)
    fit = _pid_of("cosmos_pl.cli", "fit", str(pair_yaml))
    if fit is not None and not (pair_yaml.parent / "summary.json").exists():
        os.kill(_parent(fit), signal.SIGUSR2)
        done["signalled"] = True


@pytest.fixture(scope="module")
def on_slurm(compared, tmp_path_factory):
    """cosmos's seed-0 pair of the same comparison through `--launcher slurm` with submitit's local executor (jobs
    as processes, requeue included), pre-empted once its round 0 is checkpointed. One seed: the second seed's pair
    would take the same path again (tests/test_slurm_cluster.py runs every pair on a real scheduler)."""
    _, argv = compared
    out = tmp_path_factory.mktemp("slurm") / "out"
    pair = out / "runs" / "cosmos-seed0"
    done: dict = {}
    watcher = threading.Thread(target=_preempt_when,
                               args=(pair / "checkpoints" / "round-0000.pt", pair / "pair.yaml", done), daemon=True)
    watcher.start()
    slurm_argv = [*with_out(argv, out), "--algorithms", "cosmos", "--seeds", "0", "--launcher", "slurm",
                  "--slurm.cluster", "local", "--slurm.cpus_per_job", "1", "--executor.workers_per_device", "1",
                  "--slurm.time_min", "20", "--wandb.mode", "disabled"]
    assert main(slurm_argv) == 0
    watcher.join()
    return out, done


def test_slurm_launcher_gives_the_local_launchers_numbers(compared, on_slurm):
    """--launcher slurm (submitit's local executor, 1 CPU per job) and --launcher local --jobs 2 (1 thread per
    pair) run the same pair config: cosmos's seed-0 row of the one-seed comparison is that pair's final accuracy in
    the local comparison, number for number; its round 0 ran as one job, and the pair loaded it."""
    local, _ = compared
    out, _ = on_slurm
    with open(out / "comparison.csv") as f:
        row = next(r for r in csv.DictReader(f) if r["algorithm"] == "cosmos")
    final = json.loads((local / "runs" / "cosmos-seed0" / "summary.json").read_text())["final"]["personalized_acc"]
    assert (float(row["final_mean"]), row["seeds"]) == (pytest.approx(final["mean"], abs=1e-6), "0")
    assert "| cosmos" in (out / "comparison.md").read_text()
    assert sorted(p.name for p in (out / "round0" / "jobs").iterdir()) == ["seed0-0"]
    assert "round 0: client models loaded from" in (out / "runs" / "cosmos-seed0" / "log.txt").read_text()


def test_a_preempted_slurm_job_requeues_and_resumes_to_the_same_numbers(compared, on_slurm):
    """The pre-empted job stopped its pair after round 0, submitit requeued it, and the pair went on with
    `fit --resume`: its records equal the uninterrupted local run's byte for byte."""
    local, _ = compared
    out, done = on_slurm
    assert done.get("signalled"), "the pair finished before the pre-emption signal could be sent"
    pair = out / "runs" / "cosmos-seed0"
    assert "resumed after round 0" in (pair / "log.txt").read_text()
    job_logs = "".join(p.read_text(errors="replace") for p in (out / "slurm").glob("*_log.out"))
    assert "Requeued job" in job_logs
    for name in ("metrics.csv", "clients.csv"):
        assert (pair / name).read_bytes() == (local / "runs" / "cosmos-seed0" / name).read_bytes(), name


def test_wandb_groups_the_comparison_and_logs_its_table(compared):
    """Read back from the offline run files: every pair's run has the comparison's group (the --out folder's
    name), its algorithm as job type and its seed in the config; the table run holds comparison.csv."""
    from wandb_records import records

    out, _ = compared
    for alg in ("cosmos", "fedmd"):
        for seed in (0, 1):
            files = sorted((out / "runs" / f"{alg}-seed{seed}" / "wandb").glob("offline-run-*/run-*.wandb"))
            assert files, (alg, seed)
            for f in files:  # a resumed pair continues its W&B run: one more offline folder, the same run
                run = next(r.run for r in records(f) if r.WhichOneof("record_type") == "run")
                config = {i.key: json.loads(i.value_json) for i in run.config.update}
                assert (run.run_group, run.job_type, config["seed"]) == ("digits-ab", alg, seed), f
    table_runs = sorted((out / "wandb").glob("offline-run-*/run-*.wandb"))  # one per report written (a rerun: 2)
    assert table_runs
    with open(out / "comparison.csv") as f:
        rows = list(csv.reader(f))
    for table_run in table_runs:
        run = next(r.run for r in records(table_run) if r.WhichOneof("record_type") == "run")
        assert (run.run_group, run.job_type) == ("digits-ab", "comparison")
        [table] = table_run.parent.glob("files/media/table/comparison_*.table.json")
        logged = json.loads(table.read_text())
        assert logged["columns"] == rows[0]
        for got, want in zip(logged["data"], rows[1:], strict=True):
            assert got[0] == want[0] and got[4] == pytest.approx(float(want[4]))  # algorithm, final_mean


def test_a_failed_slurm_job_names_its_slurm_log(tmp_path):
    """A job that ended without a result (cancelled, or timed out too many times) is reported with its state and
    its Slurm log; a pair that failed inside its job keeps its own reason, with the Slurm log added."""
    from cosmos_pl.compare.slurm import _failure

    class Job:
        job_id, state = "42_3", "TIMEOUT"
        paths = type("Paths", (), {"stdout": tmp_path / "42_3_0_log.out"})

        def __init__(self, outcome):
            self.outcome = outcome

        def result(self):
            if isinstance(self.outcome, Exception):
                raise self.outcome
            return self.outcome

    from submitit.core.utils import UncompletedJobError

    assert _failure(Job(None), "the pair's") is None
    no_result = UncompletedJobError("Job 42_3 (task: 0) with path /x/42_3_0_result.pkl has not produced any output")
    assert _failure(Job(no_result), "the pair's") == \
        f"the pair's Slurm job 42_3 ended TIMEOUT without a result (Slurm log: {tmp_path / '42_3_0_log.out'})"
    text = _failure(Job(RuntimeError("Job not requeued because: timed-out too many times.")), "the pair's")
    assert text == (f"the pair's Slurm job 42_3 ended TIMEOUT: Job not requeued because: timed-out too many "
                    f"times. (Slurm log: {tmp_path / '42_3_0_log.out'})")
    assert _failure(Job("exit status 2: boom (log: x)"), "the pair's") == \
        f"exit status 2: boom (log: x) (Slurm log: {tmp_path / '42_3_0_log.out'})"

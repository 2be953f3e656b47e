"""One process per run directory and per compare folder, with real processes: a second one exits 2 naming the
first; a lock left by a killed process does not block the next run.

Process A stalls in round 0 (the test-only ``hang`` fault on client 0's first forward pass) so that it holds its
folder for as long as the test needs. The second commands run in the test's own process (``cosmos_pl.cli.main``,
whose return value is the console script's exit status): another process than A, without the start-up of one.
"""

import json
import os
import signal
import subprocess
import sys

import pytest

from cosmos_pl.runs.locks import LOCK_NAME
from conftest import PROCESS_TIMEOUT_S, until
from hooks_path import with_hooks

pytestmark = pytest.mark.slow  # subprocess runs, or a Flower federation

HANG_ROUND_0 = json.dumps([{"round": 0, "client": 0, "step": "local training", "kind": "hang"}])


def _start(argv, faults=""):
    env = {k: v for k, v in os.environ.items() if k != "COSMOS_PL_TEST_FAULTS"}
    if faults:  # the child installs the test faults (tests/hooks/sitecustomize.py)
        env = with_hooks({**env, "COSMOS_PL_TEST_FAULTS": faults})
    return subprocess.Popen([sys.executable, "-m", "cosmos_pl.cli", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)


def _holding(folder, proc):
    """Wait until ``proc`` holds ``folder``'s lock (its pid is in the lock file)."""
    def held():
        try:
            return json.loads((folder / LOCK_NAME).read_text() or "{}").get("pid") == proc.pid
        except (OSError, ValueError):
            return False

    until(held, "the first process to take the lock", PROCESS_TIMEOUT_S, 0.1, proc)


def _written(path, proc):
    """Wait until ``proc`` has written ``path``."""
    until(path.is_file, f"the first process to write {path.name}", PROCESS_TIMEOUT_S, 0.1, proc)


def _fit(repo_root, *flags):
    return ["fit", "--config", str(repo_root / "configs/digits_smoke.yaml"), "--wandb.mode", "disabled",
            "--data.num_clients", "5", "--clients.pretrain_epochs", "1", "--executor.threads_per_worker", "1", *flags]


def _here(argv, capsys):
    """``cosmos-pl ARGV`` in this process: its exit status and what it wrote to stderr."""
    from cosmos_pl.cli import main

    capsys.readouterr()
    status = main(argv)
    return status, capsys.readouterr().err


def test_a_second_process_on_a_run_directory_or_compare_folder_in_use_exits_2_naming_the_first(repo_root, tmp_path,
                                                                                             capsys):
    run, out = tmp_path / "run", tmp_path / "cmp"
    fit_a = _start(_fit(repo_root, "--run_dir", str(run)), HANG_ROUND_0)
    compare_a = _start(["compare", "--config", str(repo_root / "configs/digits_smoke.yaml"), "--algorithms", "local",
                        "--seeds", "0", "--out", str(out), "--data.num_clients", "5"], HANG_ROUND_0)
    try:
        _holding(run, fit_a)
        _holding(out, compare_a)
        # each lock comes before the files checked below (config.yaml, pair.yaml): wait for them too, so that the
        # resume meets a run that started round 0 and the refused compare finds the pair folder there
        _written(run / "config.yaml", fit_a)
        _written(out / "runs" / "local-seed0" / "pair.yaml", compare_a)
        second = [
            _here(_fit(repo_root, "--run_dir", str(run), "--overwrite", "true"), capsys),
            _here(["compare", "--config", str(repo_root / "configs/digits_smoke.yaml"), "--algorithms", "local",
                   "--seeds", "0", "--out", str(out), "--data.num_clients", "5"], capsys),
        ]
        for (status, err), first, folder, key in ((second[0], fit_a, run, "--run_dir"),
                                                  (second[1], compare_a, out, "--out")):
            lines = err.strip().splitlines()
            assert status == 2, err
            assert len(lines) == 1 and lines[0].startswith(
                f"cosmos-pl: error: {key}='{folder}': in use by process {first.pid} (`"), err
            assert "wait for it to finish, or stop it" in lines[0]
        # the refused overwrite removed nothing of the running run, and the refused compare no pair folder
        assert (out / "runs" / "local-seed0" / "pair.yaml").is_file()
    finally:
        for proc in (fit_a, compare_a):
            os.killpg(proc.pid, signal.SIGKILL)  # as an OOM kill would: no chance to clean up
            proc.communicate()
    # the killed processes' locks went with them: the next runs get past the lock (and stop at the next check:
    # the first run never finished round 0, so there is nothing to resume)
    status, err = _here(_fit(repo_root, "--resume", str(run)), capsys)
    assert status == 2 and "no checkpoint in" in err and "in use" not in err

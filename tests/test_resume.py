"""Round checkpoints and exact resume.

A digits run is stopped in the middle of round 2, by SIGKILL or by SIGTERM, then resumed with
``cosmos-pl fit --resume``; its ``metrics.csv`` and ``clients.csv`` must equal, byte for byte, those of the same
run never interrupted. To stop it surely inside round 2, client 0's first forward pass of round 2 stalls (the
test-only ``hang`` fault, ``tests/hooks/fault_injection.py``); the resumed run has no fault.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from cosmos_pl.cli import run
from cosmos_pl.errors import ConfigError
from cosmos_pl.runs.checkpoint import load_latest
from conftest import PROCESS_TIMEOUT_S, small_digits_argv
from hooks_path import with_hooks

# subprocess runs, or a Flower federation; on one worker, which trains the killed run once (`--dist loadgroup`)
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("resume")]

STALL_ROUND_2 = json.dumps([{"round": 2, "client": 0, "step": "local training", "kind": "hang"}])


def _argv(repo_root: Path, run_dir: Path) -> list[str]:
    return small_digits_argv(repo_root, run_dir)  # the uninterrupted run is conftest's small_digits_run


def _start(argv: list[str], faults: str = "") -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != "COSMOS_PL_TEST_FAULTS"}
    if faults:  # the child installs the test faults (tests/hooks/sitecustomize.py)
        env = with_hooks({**env, "COSMOS_PL_TEST_FAULTS": faults})
    return subprocess.Popen([sys.executable, "-m", "cosmos_pl.cli", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


def _finish(proc: subprocess.Popen, status: int = 0) -> str:
    out, err = proc.communicate(timeout=PROCESS_TIMEOUT_S)
    assert proc.returncode == status, f"exit {proc.returncode}\n{out[-3000:]}\n{err[-3000:]}"
    return err


def _stop_in_round_2(repo_root: Path, run_dir: Path, sig: int) -> subprocess.Popen:
    """Start the run with round 2 stalled; once round 1's checkpoint exists and the stall has begun, send ``sig``."""
    proc = _start(_argv(repo_root, run_dir), STALL_ROUND_2)
    start = time.monotonic()
    while not (run_dir / "checkpoints" / "round-0001.pt").exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() - start < PROCESS_TIMEOUT_S, "round 1 did not finish"
        time.sleep(0.05)
    time.sleep(3)  # round 2's local training of client 0 has begun, inside Lightning, and stalls
    proc.send_signal(sig)
    return proc


def _same_records(a: Path, b: Path) -> None:
    for name in ("metrics.csv", "clients.csv"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


@pytest.fixture(scope="module")
def uninterrupted(small_digits_run):
    return small_digits_run


@pytest.fixture(scope="module")
def killed(repo_root, tmp_path_factory):
    """A run SIGKILLed in the middle of round 2: its folder holds the checkpoints of rounds 0 and 1."""
    run_dir = tmp_path_factory.mktemp("resume") / "killed"
    _finish(_stop_in_round_2(repo_root, run_dir, signal.SIGKILL), -signal.SIGKILL)
    assert sorted(p.name for p in (run_dir / "checkpoints").glob("*.pt")) == ["round-0000.pt", "round-0001.pt"]
    assert not (run_dir / "summary.json").exists()
    return run_dir


def test_sigkill_in_round_2_then_resume_gives_identical_records(killed, uninterrupted, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(killed, run_dir)
    err = _finish(_start(["fit", "--resume", str(run_dir)]))
    _same_records(run_dir, uninterrupted)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["final"]["round"] == 2 and summary["failures"] == []
    # pruned to the newest 2 (checkpoint.keep), the last one is the final round's
    assert sorted(p.name for p in (run_dir / "checkpoints").glob("*.pt")) == ["round-0001.pt", "round-0002.pt"]
    assert "Traceback" not in err


def test_an_unreadable_newest_checkpoint_is_skipped_with_a_warning(killed, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(killed, run_dir)
    newest = run_dir / "checkpoints" / "round-0001.pt"
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])  # torn
    with pytest.warns(RuntimeWarning, match="round-0001.pt cannot be read"):
        state, path = load_latest(run_dir)
    assert state["round"] == 0 and path.name == "round-0000.pt"


def test_checkpoints_hold_tensors_and_plain_values_only(killed):
    # weights_only loading refuses anything that would run code; the file carries what a resume needs
    state = torch.load(killed / "checkpoints" / "round-0001.pt", weights_only=True)
    assert state["round"] == 1 and len(state["clients"]["models"]) == 5 and state["config_hash"]
    assert state["algorithm"]["clusters"] and len(state["algorithm"]["teachers"]) == len(state["algorithm"]["clusters"])
    assert [r["round"] for r in state["records"]["rows"]] == [0, 1]


def test_sigterm_in_round_2_exits_143_then_resumes_exactly_even_from_a_torn_checkpoint(repo_root, uninterrupted,
                                                                                      tmp_path):
    run_dir = tmp_path / "run"
    err = _finish(_stop_in_round_2(repo_root, run_dir, signal.SIGTERM), 143)
    last = err.strip().splitlines()[-1]
    assert last == (f"cosmos-pl: stopped by SIGTERM; rounds 0..1 are saved in {run_dir}/checkpoints: resume with "
                    f"`cosmos-pl fit --resume {run_dir}`")
    assert not (run_dir / "summary.json").exists()  # a stopped run is not reported as finished
    # the newest checkpoint torn (a crash of the disk): the resume warns, goes back to round 0, ends the same
    newest = run_dir / "checkpoints" / "round-0001.pt"
    newest.write_bytes(newest.read_bytes()[:1000])
    err = _finish(_start(["fit", "--resume", str(run_dir)]))
    assert "round-0001.pt cannot be read" in err and "falling back to the one before it" in err
    _same_records(run_dir, uninterrupted)


def test_resume_refuses_a_changed_config(killed, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(killed, run_dir)
    with pytest.raises(ConfigError, match=r"--resume=.*another config.*rounds \(run: 2, given: 5\)"):
        run(["fit", "--resume", str(run_dir), "--rounds", "5"])
    # resumed runs stay in their own folder; a missing folder is named as such
    with pytest.raises(ConfigError, match=r"--run_dir=.* a run resumes in its own folder"):
        run(["fit", "--resume", str(run_dir), "--run_dir", str(tmp_path / "elsewhere")])
    with pytest.raises(ConfigError, match=r"--overwrite=true with --resume"):
        run(["fit", "--resume", str(run_dir), "--overwrite", "true"])
    with pytest.raises(ConfigError, match=r"does not exist"):
        run(["fit", "--resume", str(tmp_path / "missing")])
    assert not (tmp_path / "elsewhere").exists()


def test_sigint_exits_130_with_the_resume_command(repo_root, tmp_path):
    """Ctrl-C during round 1 (client 0's pseudo-labels stall): round 0 is kept and the run says how to resume."""
    run_dir = tmp_path / "run"
    proc = _start(_argv(repo_root, run_dir),
                  json.dumps([{"round": 1, "client": 0, "step": "pseudo-labels", "kind": "hang"}]))
    start = time.monotonic()
    while not (run_dir / "checkpoints" / "round-0000.pt").exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() - start < PROCESS_TIMEOUT_S, "round 0 did not finish"
        time.sleep(0.05)
    time.sleep(2)
    proc.send_signal(signal.SIGINT)
    err = _finish(proc, 130)
    assert err.strip().splitlines()[-1] == (f"cosmos-pl: stopped by SIGINT; rounds 0..0 are saved in {run_dir}/checkpoints: "
                                            f"resume with `cosmos-pl fit --resume {run_dir}`")

"""SIGTERM at N random moments of rounds 1-2 of a digits run: each must stop the run with exit 143 and the resume
line, and each resumed run must end with metrics.csv and clients.csv byte-identical to one run never interrupted.

One reference run first (uninterrupted; its rounds 1-2 last W seconds, from its round-0 checkpoint to its round-2
checkpoint). Then, one after another until N SIGTERMs have landed inside rounds 1-2: start the same run, wait for
its round-0 checkpoint, wait a seeded random fraction of 0.9 W, send SIGTERM, check the exit status (143), the last stderr line (``cosmos-pl:
stopped by SIGTERM; rounds 0..r are saved in DIR/checkpoints: resume with `cosmos-pl fit --resume DIR```, r the
newest checkpoint there) and that no summary.json was written; then ``cosmos-pl fit --resume DIR`` and compare
its records with the reference's. A SIGTERM sent after the run's round-2 checkpoint appeared (the run went faster
than the reference: the results were written, and a late SIGTERM leaves exit 0) is counted as ``late``, its
resume still checked, and another moment is drawn in its place. Every process has one torch thread. The last line is
JSON: exit codes, bad resume lines, failed resumes, mismatches, late sends, seconds.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/sigterm_loop.py [--n 50] [--seed 0] [--out DIR] [--keep]
        [--fit "extra cosmos-pl fit flags"]

Default run: configs/digits_smoke.yaml, rounds 0..2, 5 clients, 1 epoch of pre-training, PTC and teacher training.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIT = ["--rounds", "2", "--data.num_clients", "5", "--clients.pretrain_epochs", "1",
       "--algorithm.init_args.ptc_epochs", "1", "--algorithm.init_args.teacher_epochs", "1",
       "--wandb.mode", "disabled", "--executor.threads_per_worker", "1"]
RECORDS = ("metrics.csv", "clients.csv")


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "COSMOS_PL_TEST_FAULTS"}
    env["OMP_NUM_THREADS"] = "1"
    return env


def _run(args: list[str], stderr: Path, wait: bool = False) -> subprocess.Popen:
    """``cosmos-pl ARGS`` with its stderr in a file (a pipe nobody reads while it runs could fill and stall it)."""
    with open(stderr, "w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "cosmos_pl.cli", *args], stdout=subprocess.DEVNULL, stderr=err,
                                env=_env(), cwd=ROOT)
    if wait:
        proc.wait(timeout=1800)
    return proc


def _wait_for(path: Path, proc: subprocess.Popen, limit: float = 1800) -> float:
    """Poll until ``path`` exists; returns the time it was seen (monotonic). Raises if the process ends first."""
    start = time.monotonic()
    while not path.exists():
        if proc.poll() is not None:
            raise RuntimeError(f"the run ended (exit {proc.returncode}) before {path.name} appeared")
        if time.monotonic() - start > limit:
            raise RuntimeError(f"{path.name} did not appear within {limit} s")
        time.sleep(0.01)
    return time.monotonic()


def _last_line(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[-1] if lines else ""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=50, help="SIGTERMs (one run and one resume each)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random moments")
    p.add_argument("--out", type=Path, default=None, help="folder for the runs (default: a temporary folder)")
    p.add_argument("--keep", action="store_true", help="keep the run folders (default: each is removed once checked)")
    p.add_argument("--fit", default="", help="extra `cosmos-pl fit` flags, e.g. \"--data.num_clients 3\"")
    a = p.parse_args()
    out = a.out or Path(tempfile.mkdtemp(prefix="sigterm_loop-"))
    out.mkdir(parents=True, exist_ok=True)
    fit = ["fit", "--config", str(ROOT / "configs/digits_smoke.yaml"), *FIT, *shlex.split(a.fit)]
    began = time.monotonic()

    ref = out / "reference"
    shutil.rmtree(ref, ignore_errors=True)
    proc = _run([*fit, "--run_dir", str(ref)], out / "reference.err")
    t0 = _wait_for(ref / "checkpoints" / "round-0000.pt", proc)
    t2 = _wait_for(ref / "checkpoints" / "round-0002.pt", proc)
    if proc.wait() != 0:
        raise SystemExit(f"the reference run failed (exit {proc.returncode}):\n{(out / 'reference.err').read_text()[-3000:]}")
    window = t2 - t0
    reference = {name: (ref / name).read_bytes() for name in RECORDS}
    print(f"reference run: {time.monotonic() - began:.0f} s; rounds 1-2 took {window:.1f} s", flush=True)

    rng = random.Random(a.seed)
    codes: collections.Counter = collections.Counter()
    bad_lines, failed_resumes, mismatches, late, stopped_after = 0, 0, 0, 0, collections.Counter()
    k = 0
    while k - late < a.n:
        trial = time.monotonic()
        run_dir = out / f"run-{k:03d}"
        shutil.rmtree(run_dir, ignore_errors=True)
        delay = rng.random() * 0.9 * window
        stderr = out / f"run-{k:03d}.err"
        proc = _run([*fit, "--run_dir", str(run_dir)], stderr)
        _wait_for(run_dir / "checkpoints" / "round-0000.pt", proc)
        time.sleep(delay)
        sent_late = (run_dir / "checkpoints" / "round-0002.pt").exists()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=1800)
        err = stderr.read_text()
        if sent_late:
            late += 1
            note = f"late (exit {proc.returncode}), not checked"
        else:
            codes[proc.returncode] += 1
            rounds = sorted(int(m.group(1)) for f in (run_dir / "checkpoints").glob("round-*.pt")
                            if (m := re.match(r"round-(\d+)\.pt$", f.name)))
            last = rounds[-1] if rounds else None
            expected = (f"cosmos-pl: stopped by SIGTERM; rounds 0..{last} are saved in {run_dir}/checkpoints: resume "
                        f"with `cosmos-pl fit --resume {run_dir}`")
            ok_line = _last_line(err) == expected and not (run_dir / "summary.json").exists()
            bad_lines += not ok_line
            stopped_after[str(last)] += 1
            note = f"exit {proc.returncode}, rounds 0..{last} kept" + ("" if ok_line else f"; BAD: {_last_line(err)!r}")
            if proc.returncode != 143:
                note += f"\n{err[-3000:]}"
        resume = _run(["fit", "--resume", str(run_dir)], out / f"run-{k:03d}.resume.err", wait=True)
        if resume.returncode != 0:
            failed_resumes += 1
            note += f"; resume FAILED (exit {resume.returncode}): " \
                    f"{_last_line((out / f'run-{k:03d}.resume.err').read_text())!r}"
        else:
            differ = [name for name in RECORDS if (run_dir / name).read_bytes() != reference[name]]
            mismatches += bool(differ)
            note += "; resumed: identical" if not differ else f"; resumed: MISMATCH in {', '.join(differ)}"
        print(f"[{k + 1 - late}/{a.n}] SIGTERM {delay:.2f} s after round 0's checkpoint: {note} "
              f"({time.monotonic() - trial:.0f} s)", flush=True)
        if not a.keep:
            shutil.rmtree(run_dir, ignore_errors=True)
            for f in out.glob(f"run-{k:03d}*.err"):
                f.unlink()
        k += 1

    checked = a.n
    ok = codes.get(143, 0) == checked and bad_lines == 0 and failed_resumes == 0 and mismatches == 0
    seconds = time.monotonic() - began
    print(f"{a.n} SIGTERMs during rounds 1-2 ({late} late ones redrawn): {codes.get(143, 0)} of {checked} exited 143 "
          f"with the resume line; {failed_resumes} resumes failed; {mismatches} resumed runs differ from the reference; "
          f"{seconds:.0f} s in all -> {'OK' if ok else 'FAILED'}")
    print(json.dumps({"n": a.n, "seed": a.seed, "exit_codes": {str(c): n for c, n in sorted(codes.items())},
                      "late": late, "bad_resume_lines": bad_lines, "stopped_with_rounds_kept": dict(stopped_after),
                      "failed_resumes": failed_resumes, "mismatches": mismatches, "ok": ok,
                      "window_s": round(window, 1), "seconds": round(seconds, 1)}, sort_keys=True))
    if not a.keep and a.out is None:
        shutil.rmtree(out, ignore_errors=True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
